"""mode="numpy" | "jax" | "tensorflow": the torch batches, as each framework's arrays (ddbloader._modes).

The oracle for every mode is the same loader in ``mode="pytorch"``: the same samples in the same
order, shapes, dtypes and keys. A framework's tests skip only when it is not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pytest
import torch

from ddbloader import DDBDataLoader, DDBIterableDataset
from ddbloader._modes import Handover

SQL = "SELECT * FROM t ORDER BY g, ts"

# The table carries a text column so that key_col can name it; where x takes the default columns the
# loader says it leaves that column out of x, which is expected here.
pytestmark = pytest.mark.filterwarnings(r"ignore:leaving non-numeric columns \['name'\] out of x:UserWarning")
MODES = ["numpy", "jax", "tensorflow"]


def _framework(mode: str) -> Any:
    if mode == "numpy":
        return np
    return pytest.importorskip(mode, reason=f"mode={mode!r} needs {mode}: pip install 'ddbloader[{mode}]'")


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t AS SELECT i % 5 AS g, i AS ts, (i // 40)::INTEGER AS day, "
        "sin(i)::DOUBLE AS a, (i * 0.25)::FLOAT AS b, (i % 7)::DOUBLE AS y, 'k' || (i % 11) AS name "
        "FROM range(400) r(i)"
    )
    yield con
    con.close()


@pytest.fixture
def x64() -> Iterator[None]:
    """JAX keeps 64-bit arrays (the loader refuses to let it truncate them, see test below)."""
    jax = _framework("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def _host(value: Any) -> np.ndarray[Any, Any]:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _assert_same(got: list[Any], want: list[Any], mode: str) -> None:
    array_type = {"numpy": np.ndarray, "jax": "ArrayImpl", "tensorflow": "EagerTensor"}[mode]
    assert len(got) == len(want) > 0
    for batch, reference in zip(got, want, strict=True):
        assert len(batch) == len(reference)
        for value, expected in zip(batch[:2], reference[:2], strict=True):
            kind = type(value)
            assert kind is array_type if isinstance(array_type, type) else kind.__name__ == array_type
            assert _host(value).dtype == _host(expected).dtype
            np.testing.assert_array_equal(_host(value), _host(expected))
        if len(batch) == 3:
            assert batch[2].keys() == reference[2].keys()
            for name, value in batch[2].items():
                expected = reference[2][name]
                if isinstance(expected, list):
                    assert value == expected
                else:
                    assert _host(value).dtype == _host(expected).dtype
                    np.testing.assert_array_equal(_host(value), _host(expected))


CONFIGS: list[dict[str, Any]] = [
    {"batch_size": 16},
    {"batch_size": 7, "shuffle": True, "window_size": 3, "group_col": "g", "drop_last": True},
    {"batch_size": 5, "shuffle": True, "window_size": [4, 2], "window_stride": 2, "group_col": "g",
     "repartition_col": "day", "key_col": ["ts", "name"]},
    {"batch_size": 9, "window_size": 6, "group_col": "g", "repartition_col": "day", "key_col": "ts",
     "group_pool_size": 8, "input_col": ["a", "b"]},
    {"batch_size": 32, "shuffle": True, "key_col": "g", "exclude_col": ["day"], "dtype": torch.float32},
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_batches_equal_the_torch_batches(
    db: duckdb.DuckDBPyConnection, mode: str, config: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    _framework(mode)
    if mode == "jax":
        request.getfixturevalue("x64")
    kwargs = {"seed": 11, **config}
    with DDBDataLoader(db, SQL, "y", **kwargs) as torch_loader:
        want = [list(torch_loader), list(torch_loader)]  # two epochs: the order changes with shuffle
    with DDBDataLoader(db, SQL, "y", mode=mode, **kwargs) as loader:
        assert len(loader) == len(want[0])
        for epoch in want:
            _assert_same(list(loader), epoch, mode)


@pytest.mark.parametrize("mode", MODES)
def test_held_batches_stay_intact_after_the_epoch(
    db: duckdb.DuckDBPyConnection, mode: str, request: pytest.FixtureRequest
) -> None:
    """Zero-copy views of every batch of two epochs, held to the end, equal a fresh run's batches:
    no memory under a view is reused (arena of whole partitions, assembler 4 batches ahead)."""
    _framework(mode)
    if mode == "jax":
        request.getfixturevalue("x64")
    kwargs = {"seed": 5, "batch_size": 3, "shuffle": True, "window_size": 4, "group_col": "g",
              "repartition_col": "day", "group_pool_size": 8, "prefetch_batch": 4,
              "key_col": "ts"}  # fmt: skip
    with DDBDataLoader(db, SQL, "y", mode=mode, **kwargs) as loader:
        held = [list(loader), list(loader)]
    with DDBDataLoader(db, SQL, "y", **kwargs) as fresh:
        for epoch in held:
            assert len(epoch) > 100
            _assert_same(epoch, list(fresh), mode)


def test_conversions_share_the_batch_memory() -> None:
    """NumPy and TensorFlow views of a host batch, and JAX's of 64-byte aligned memory (all that
    torch allocates), are the batch's own memory: nothing is copied."""
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    assert x.data_ptr() % 64 == 0
    as_numpy = Handover({"mode": "numpy", "pin_memory": "auto", "device": "cpu"}, ()).array(x)
    assert as_numpy.ctypes.data == x.data_ptr()
    if _installed("jax"):
        as_jax = Handover({"mode": "jax", "pin_memory": "auto", "device": "cpu"}, ()).array(x)
        assert as_jax.unsafe_buffer_pointer() == x.data_ptr()
    if _installed("tensorflow"):
        as_tf = Handover({"mode": "tensorflow", "pin_memory": "auto", "device": "cpu"}, ()).array(x)
        x[0, 0] = -1.0  # a write to the batch shows through the tensor: one memory
        assert float(as_tf[0, 0]) == -1.0


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("mode", MODES)
def test_resume_mid_epoch(db: duckdb.DuckDBPyConnection, mode: str, request: pytest.FixtureRequest) -> None:
    _framework(mode)
    if mode == "jax":
        request.getfixturevalue("x64")
    kwargs = {
        "seed": 3,
        "batch_size": 6,
        "shuffle": True,
        "window_size": 3,
        "group_col": "g",
        "key_col": "ts",
    }
    with DDBDataLoader(db, SQL, "y", **kwargs) as torch_loader:
        want = list(torch_loader)
    with DDBDataLoader(db, SQL, "y", mode=mode, **kwargs) as loader:
        steps = iter(loader)
        first = [next(steps) for _ in range(7)]
        state = loader.state_dict()
    with DDBDataLoader(db, SQL, "y", mode=mode, **kwargs) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    _assert_same(first + rest, want, mode)


def test_explicit_rank_and_world_size_split_the_epoch(db: duckdb.DuckDBPyConnection) -> None:
    """Under a JAX or TensorFlow launch (no torch process group) rank= and world_size= shard."""
    kwargs = {"seed": 2, "batch_size": 4, "shuffle": True, "key_col": "ts", "mode": "numpy"}
    with DDBDataLoader(db, SQL, "y", **kwargs) as whole:
        everything = sorted(int(t) for *_, keys in whole for t in keys["ts"])
    served = []
    for rank in (0, 1):
        with DDBDataLoader(db, SQL, "y", rank=rank, world_size=2, **kwargs) as shard:
            served.append([int(t) for *_, keys in shard for t in keys["ts"]])
    assert not set(served[0]) & set(served[1])
    assert sorted(served[0] + served[1]) == everything == list(range(400))


def test_keras_fit_on_as_tf_dataset(db: duckdb.DuckDBPyConnection) -> None:
    tf = _framework("tensorflow")
    keras = tf.keras
    kwargs = {"seed": 0, "batch_size": 32, "shuffle": True, "window_size": 4, "group_col": "g",
              "input_col": ["a", "b"], "dtype": torch.float32}  # fmt: skip
    with DDBDataLoader(db, SQL, "y", mode="tensorflow", **kwargs) as loader:
        dataset = loader.as_tf_dataset()
        assert int(dataset.cardinality()) == len(loader)
        x_spec, y_spec = dataset.element_spec
        assert x_spec.shape.as_list() == [None, 4, 2] and y_spec.shape.as_list() == [None, 1, 1]
        model = keras.Sequential([keras.Input((4, 2)), keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        history = model.fit(
            dataset.map(lambda x, y: (x, tf.reshape(y, (-1, 1)))), epochs=2, verbose=0, shuffle=False
        )
        assert len(history.history["loss"]) == 2
        assert all(np.isfinite(history.history["loss"]))
        assert loader.epoch == 2  # each Keras epoch ran one loader epoch
        assert history.history["loss"][1] < history.history["loss"][0]


def test_as_tf_dataset_refuses_what_it_cannot_type(db: duckdb.DuckDBPyConnection) -> None:
    _framework("tensorflow")
    with (
        DDBDataLoader(db, SQL, "y", mode="numpy") as loader,
        pytest.raises(ValueError, match=r"as_tf_dataset\(\) needs mode='tensorflow', not 'numpy'"),
    ):
        loader.as_tf_dataset()
    with (
        DDBDataLoader(db, SQL, "y", mode="tensorflow", key_col="name") as loader,
        pytest.raises(ValueError, match=r"key_col \['name'\] come as lists"),
    ):
        loader.as_tf_dataset()


def test_jitted_jax_step_trains(db: duckdb.DuckDBPyConnection) -> None:
    jax = _framework("jax")
    jnp = jax.numpy
    kwargs = {"seed": 0, "batch_size": 25, "shuffle": True, "input_col": ["a", "g"], "dtype": torch.float32}

    @jax.jit
    def step(w: Any, x: Any, y: Any) -> tuple[Any, Any]:
        def loss(w: Any) -> Any:
            return jnp.mean((x @ w - y) ** 2)

        value, grad = jax.value_and_grad(loss)(w)
        return w - 0.05 * grad, value

    w = jnp.zeros((2, 1), jnp.float32)
    losses = []
    with DDBDataLoader(db, SQL, "y", mode="jax", **kwargs) as loader:
        for _ in range(3):
            total = 0.0
            for x, y in loader:
                w, value = step(w, x, y)
                total += float(value)
            losses.append(total / len(loader))
    assert losses[-1] < losses[0]


def test_jax_without_x64_is_refused_before_iterating(db: duckdb.DuckDBPyConnection) -> None:
    jax = _framework("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        truncated = r"mode='jax' would truncate ts \(int64\) to 32 bits"
        with pytest.raises(ValueError, match=truncated):
            DDBDataLoader(db, SQL, "y", mode="jax", key_col="ts", input_col=["a"])
        with DDBDataLoader(db, SQL, "y", mode="jax", dtype=torch.float32) as loader:
            x, y = next(iter(loader))
            assert x.dtype == y.dtype == jax.numpy.float32
    finally:
        jax.config.update("jax_enable_x64", before)


def test_devices_and_arguments_each_mode_refuses(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"device='cuda' with mode='numpy'"):
        DDBDataLoader(db, SQL, "y", mode="numpy", device="cuda")
    with pytest.raises(ValueError, match=r"pin_memory=True pins torch batches; mode='numpy'"):
        DDBDataLoader(db, SQL, "y", mode="numpy", pin_memory=True)
    with pytest.raises(ValueError, match=r"mode='numpy' needs DDBDataLoader"):
        DDBIterableDataset(db, SQL, "y", mode="numpy")
    if _installed("jax"):
        with pytest.raises(ValueError, match=r"device='tpu' is not a JAX device here"):
            DDBDataLoader(db, SQL, "y", mode="jax", device="tpu")
    if _installed("tensorflow"):
        with pytest.raises(ValueError, match=r"device='/TPU:0' is not a TensorFlow device here"):
            DDBDataLoader(db, SQL, "y", mode="tensorflow", device="/TPU:0")
        with DDBDataLoader(db, SQL, "y", mode="TensorFlow", device="/CPU:0") as loader:
            x, _ = next(iter(loader))
            assert x.device.endswith("CPU:0")


def test_a_missing_framework_names_its_extra(
    db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    for mode in ("jax", "tensorflow"):
        monkeypatch.setitem(sys.modules, mode, None)  # import jax / tensorflow now raises ImportError
        with pytest.raises(
            ImportError, match=rf"mode='{mode}' needs {mode}.*pip install 'ddbloader\[{mode}\]'"
        ):
            DDBDataLoader(db, SQL, "y", mode=mode)
