"""Image columns: PNG blobs in DuckDB decoded in the fetch threads into [B, C, H, W] batches.

The core path runs with the Pillow decoder (always available with the dev extra); the tests of
torchvision's own decoder and v2 pipelines skip, naming torchvision, where it is missing or does
not load with the installed torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import torch

from ddbloader import DDBDataLoader
from ddbloader.transforms import tensors
from ddbloader.vision import decode_images

Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (pip install pillow)")

HEIGHT, WIDTH = 5, 4
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits_cnn.py"


def torchvision_or_skip() -> Any:
    try:
        return importlib.import_module("torchvision")
    except Exception as exc:  # ImportError, or a build for another torch failing to load
        pytest.skip(
            f"torchvision is not installed or does not load ({type(exc).__name__}): needs ddbloader[vision]"
        )


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def gray(value: int, height: int = HEIGHT, width: int = WIDTH) -> bytes:
    """A gray image whose pixel (r, c) is ``value + c`` (so every image and column is recognisable)."""
    return png((value + np.arange(width, dtype=np.uint8)[None, :].repeat(height, 0)).astype(np.uint8))


def image_table(con: duckdb.DuckDBPyConnection, blobs: list[bytes | None]) -> None:
    """``images(id, part, png)``: two repartitions, ``part = id // 4``."""
    data = pa.table(  # noqa: F841 -- read by name by DuckDB's replacement scan below
        {
            "id": pa.array(range(len(blobs)), pa.int32()),
            "part": pa.array([i // 4 for i in range(len(blobs))], pa.int32()),
            "png": pa.array(blobs, pa.binary()),
        }
    )
    con.execute("CREATE OR REPLACE TABLE images AS SELECT * FROM data")


SQL = "SELECT id, png, part FROM images ORDER BY id"


def load(con: duckdb.DuckDBPyConnection, step: Any, **kwargs: Any) -> DDBDataLoader:
    arguments: dict[str, Any] = {"batch_size": 3, "input_col": "png", "repartition_col": "part"}
    arguments.update(kwargs)
    return DDBDataLoader(con, kwargs.pop("sql", SQL), "id", transform=step, **arguments)


# --- the core path, with Pillow -----------------------------------------------------------------


def test_png_blobs_become_image_batches(con: duckdb.DuckDBPyConnection) -> None:
    image_table(con, [gray(10 * i) for i in range(10)])
    with load(con, decode_images("png", mode="GRAY", decoder="pillow")) as loader:
        assert loader.plan.layout.x_shape == (1, HEIGHT, WIDTH)  # known before iterating
        batches = list(loader)
    x = torch.cat([x for x, _ in batches])
    ids = torch.cat([y for _, y in batches]).flatten()
    assert batches[0][0].shape == (3, 1, HEIGHT, WIDTH) and x.dtype == torch.uint8
    assert ids.tolist() == list(range(10))
    expected = torch.stack([10 * i + torch.arange(WIDTH).expand(1, HEIGHT, WIDTH) for i in range(10)])
    assert torch.equal(x, expected.to(torch.uint8))


@pytest.mark.parametrize(("mode", "channels"), [("GRAY", 1), ("RGB", 3), ("RGB_ALPHA", 4), ("UNCHANGED", 1)])
def test_the_mode_sets_the_channels(con: duckdb.DuckDBPyConnection, mode: Any, channels: int) -> None:
    image_table(con, [gray(i) for i in range(5)])
    with load(con, decode_images("png", mode=mode, decoder="pillow")) as loader:
        x, _ = next(iter(loader))
    assert x.shape == (3, channels, HEIGHT, WIDTH)
    assert torch.equal(
        x[1, :3], torch.arange(1, WIDTH + 1, dtype=torch.uint8).expand(min(channels, 3), HEIGHT, WIDTH)
    )


def test_image_windows_span_repartitions(con: duckdb.DuckDBPyConnection) -> None:
    image_table(con, [gray(i) for i in range(10)])
    loader = load(con, decode_images("png", mode="GRAY", decoder="pillow"), window_size=[3, 1], batch_size=8)
    with loader:
        ((x, y),) = list(loader)
    assert x.shape == (7, 3, 1, HEIGHT, WIDTH)  # starts 0..6: y is the row after the window
    assert x[:, :, 0, 0, 0].tolist() == [[s, s + 1, s + 2] for s in range(7)]  # crosses part 0 → 1 → 2
    assert y.flatten().tolist() == [s + 3 for s in range(7)]


def flip(image: torch.Tensor) -> torch.Tensor:
    return image.flip(-1).to(torch.float32) / 255


def test_the_pipeline_runs_per_image_in_the_fetch_threads(con: duckdb.DuckDBPyConnection) -> None:
    threads: list[str] = []

    def recording_flip(image: torch.Tensor) -> torch.Tensor:
        threads.append(threading.current_thread().name)
        return flip(image)

    image_table(con, [gray(i) for i in range(10)])
    with load(con, decode_images("png", recording_flip, mode="GRAY", decoder="pillow")) as loader:
        probe_calls = len(threads)
        x = torch.cat([x for x, _ in loader])
    assert x.dtype == torch.float32
    assert torch.equal(x[2, 0, 0], (2 + torch.arange(WIDTH - 1, -1, -1)).float() / 255)
    fetched = threads[probe_calls:]
    assert len(fetched) == 10 and all(name.startswith("ddbloader-fetch") for name in fetched)


def test_images_also_decode_from_the_tensor_form(con: duckdb.DuckDBPyConnection) -> None:
    image_table(con, [gray(i) for i in range(5)])
    steps = [tensors(dict), decode_images("png", mode="GRAY", decoder="pillow", name="pixels")]
    with load(con, steps, input_col="pixels") as loader:
        x = torch.cat([x for x, _ in loader])
    assert x.shape == (5, 1, HEIGHT, WIDTH) and x[4, 0, 0, 0] == 4


def test_images_of_different_sizes_are_refused_at_planning_with_a_hint(
    con: duckdb.DuckDBPyConnection,
) -> None:
    image_table(con, [gray(0), gray(1), gray(2, height=7), gray(3)])
    step = decode_images("png", decoder="pillow")
    with pytest.raises(ValueError, match=r"row 2 gives an image of shape \[3, 7, 4\].*Resize") as info:
        DDBDataLoader(con, SQL, "id", 2, input_col="png", transform=step)
    assert any("probing transform decode_images" in note for note in info.value.__notes__)


def test_images_of_different_sizes_across_partitions_are_refused(con: duckdb.DuckDBPyConnection) -> None:
    image_table(con, [gray(i, height=HEIGHT if i < 4 else 6) for i in range(8)])
    loader = load(con, decode_images("png", decoder="pillow"))
    with (
        loader,
        pytest.raises(ValueError, match=r"per-row shape \[3, 6, 4\], but planning saw \[3, 5, 4\]") as info,
    ):
        list(loader)
    notes = "\n".join(info.value.__notes__)
    assert "decode_images('png'" in notes and "partition 1 of group 0" in notes


def test_a_corrupt_image_names_its_row_and_partition(con: duckdb.DuckDBPyConnection) -> None:
    # The probe reads the smallest partition (ids 8, 9); the corrupt image is id 5, in partition 1.
    image_table(con, [b"not a png" if i == 5 else gray(i) for i in range(10)])
    loader = load(con, decode_images("png", decoder="pillow"))
    with loader, pytest.raises(Exception, match="cannot identify image") as info:
        list(loader)
    notes = "\n".join(info.value.__notes__)
    assert "decoding row 1 of image column 'png'" in notes
    assert "partition 1 of group 0" in notes


def test_a_null_image_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    image_table(con, [None if i == 5 else gray(i) for i in range(10)])
    loader = load(con, decode_images("png", decoder="pillow"))
    with loader, pytest.raises(ValueError, match="row 1 of column 'png' is NULL"):
        list(loader)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"decoder": "opencv"}, ValueError, "decoder must be one of"),
        ({"mode": "CMYK", "decoder": "pillow"}, ValueError, "mode must be one of"),
        ({"pipeline": 3, "decoder": "pillow"}, TypeError, "pipeline must be callable"),
    ],
)
def test_decode_images_validates_its_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        decode_images("png", **kwargs)


# --- torchvision ---------------------------------------------------------------------------------


def test_a_missing_torchvision_says_to_install_the_vision_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes the import fail as for a package that is not installed.
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(ImportError, match=r"pip install 'ddbloader\[vision\]'.*decoder='pillow'"):
        decode_images("png")


def test_torchvision_decodes_like_pillow_and_runs_a_v2_pipeline(con: duckdb.DuckDBPyConnection) -> None:
    torchvision_or_skip()
    v2 = importlib.import_module("torchvision.transforms.v2")
    image_table(con, [gray(i) for i in range(6)])
    with (
        load(con, decode_images("png", mode="GRAY")) as tv,
        load(con, decode_images("png", mode="GRAY", decoder="pillow")) as pil,
    ):
        assert all(torch.equal(a[0], b[0]) for a, b in zip(tv, pil, strict=True))
    pipeline = v2.Compose([v2.Resize((8, 8), antialias=True), v2.ToDtype(torch.float32, scale=True)])
    with load(con, decode_images("png", pipeline)) as resized:
        x, _ = next(iter(resized))
    assert x.shape == (3, 3, 8, 8) and x.dtype == torch.float32 and float(x.max()) <= 1.0


# --- the digits example ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_digits_example_trains_a_cnn_for_an_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (part of ddbloader[dev])")
    spec = importlib.util.spec_from_file_location("digits_cnn", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["digits_cnn"] = module  # pickling and dataclasses look modules up by name
    try:
        spec.loader.exec_module(module)
        accuracy = module.main([])
    finally:
        del sys.modules["digits_cnn"]
    assert accuracy > 0.6  # chance is 0.1; one epoch reaches ~0.9
    assert "test accuracy" in capsys.readouterr().out
