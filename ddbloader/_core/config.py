"""Loader arguments: DolphinDB aliases, validation and normalisation into one frozen record.

Everything here runs before any query reaches the engine, so a bad argument fails fast with a
message that names the parameter.
"""

from __future__ import annotations

import difflib
import math
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import torch

from .dtypes import numpy_dtype
from .errors import warn_caller
from .split_args import split_args

__all__ = [
    "DDB_ALIASES",
    "LoaderConfig",
    "PartitionTransform",
    "SchemeValues",
    "default_device",
    "normalise_config",
    "resolve_aliases",
]

SchemeValues = tuple[Any, ...]
#: ``collate=``: takes and returns an ``(x, y)`` batch.
Collate = Callable[[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]

#: DolphinDB DDBDataLoader keyword → ddbloader keyword.
DDB_ALIASES: Mapping[str, str] = {
    "ddbSession": "source",
    "targetCol": "target_col",
    "batchSize": "batch_size",
    "windowSize": "window_size",
    "windowStride": "window_stride",
    "inputCol": "input_col",
    "excludeCol": "exclude_col",
    "repartitionCol": "repartition_col",
    "repartitionScheme": "repartition_scheme",
    "groupCol": "group_col",
    "groupScheme": "group_scheme",
    "dropLast": "drop_last",
    "prefetchBatch": "prefetch_batch",
    "prepartitionNum": "prepartition_num",
    "groupPoolSize": "group_pool_size",
}

#: Keywords of torch's DataLoader that DDBDataLoader does not take, and what to do instead.
_TORCH_KEYWORD_HINTS: Mapping[str, str] = dict.fromkeys(
    ("num_workers", "persistent_workers", "worker_init_fn", "multiprocessing_context"),
    "for DataLoader worker processes use DDBIterableDataset(source, sql, ...) with "
    "torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=N)",
)


class PartitionTransform(Protocol):
    """What runs on every fetched partition (:class:`ddbloader.transforms.Pipeline` is one): an
    Arrow table in, the same rows out as a table or a mapping of columns; named for messages.

    A protocol, so that the configuration needs nothing from :mod:`ddbloader.transforms`, which
    builds on the SQL layer's Arrow conversions; the loader makes the ``transform=`` argument one
    (:func:`ddbloader.transforms.as_pipeline`) before normalising the rest.
    """

    @property
    def name(self) -> str: ...

    def __call__(self, table: pa.Table) -> Any: ...


@dataclass(frozen=True)
class LoaderConfig:
    """Validated loader arguments.

    Invariants: ``x_window >= 1``, ``y_window >= 1``, ``stride >= 1``, ``offset >= 0``,
    ``batch_size >= 1``, ``retries >= 0``, ``retry_backoff`` finite and ``>= 0``; ``windowed`` is
    False exactly when the user gave no ``window_size`` (then both windows are 1 and samples are
    single rows). ``seed`` is a non-negative int even when the user gave none.
    """

    target_col: tuple[str, ...]
    batch_size: int
    shuffle: bool
    windowed: bool
    x_window: int
    y_window: int
    stride: int
    offset: int
    input_col: tuple[str, ...] | None
    exclude_col: tuple[str, ...]
    group_col: str | None
    group_scheme: SchemeValues | None
    repartition_col: str | None
    repartition_scheme: SchemeValues | None
    seed: int
    drop_last: bool
    device: torch.device
    pin_memory: bool
    prefetch_batch: int
    prepartition_num: int
    group_pool_size: int
    fetch_threads: int
    x_dtype: np.dtype[Any] | None
    y_dtype: np.dtype[Any] | None
    timeout: float
    retries: int = 2
    retry_backoff: float = 0.1
    transform: PartitionTransform | None = None
    collate: Collate | None = None
    window_on_device: bool = False
    fetch_bytes: int = 8 * 2**20
    cache_bytes: int | None = None
    key_col: tuple[str, ...] = ()
    #: check each fetched partition's rows against an engine hash recorded at planning
    verify: bool = False
    #: serve only the samples whose y rows all have ``lo <= split_col < hi`` (see
    #: :mod:`ddbloader._sql.splits`); ``split_range`` is ``(lo, hi)``, either end None
    split_col: str | None = None
    split_range: tuple[Any, Any] | None = None

    @property
    def span(self) -> int:
        """Rows one sample touches, from its first x row to its last y row."""
        return max(self.x_window, self.offset + self.y_window)


def resolve_aliases(
    explicit: dict[str, Any], defaults: Mapping[str, Any], extra: Mapping[str, Any], given: Collection[str]
) -> dict[str, Any]:
    """Fold DolphinDB camelCase keywords into ``explicit``; refuse unknown or doubled keywords.

    ``given`` names the parameters the caller actually passed (a default passed explicitly too);
    one passed as ``None`` counts as not given, so ``target_col=None, targetCol="y"`` is accepted.

    Raises:
        TypeError: a keyword that is neither a parameter nor an alias, or a value given both
            under its name and under its alias.
    """
    merged = dict(explicit)
    for key, value in extra.items():
        name = DDB_ALIASES.get(key)
        if key in _TORCH_KEYWORD_HINTS:
            raise TypeError(f"DDBDataLoader() takes no {key!r}: {_TORCH_KEYWORD_HINTS[key]}")
        if name is None:
            known = [*defaults, *DDB_ALIASES]
            hint = difflib.get_close_matches(key, known, n=1)
            suffix = f"; did you mean {hint[0]!r}?" if hint else ""
            raise TypeError(f"DDBDataLoader() got an unexpected keyword argument {key!r}{suffix}")
        if name in given and merged.get(name) is not None:
            raise TypeError(f"DDBDataLoader() got {name!r} twice: as {name!r} and as its alias {key!r}")
        merged[name] = value
    return merged


def _names(
    value: Any, parameter: str, *, allow_none: bool, allow_empty: bool = False
) -> tuple[str, ...] | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{parameter} is required: give a column name or a list of names")
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{parameter} must be a column name or a list of names, got {value!r}")
    names = tuple(names)
    if not names and not allow_empty:
        raise ValueError(f"{parameter} must name at least one column")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{parameter} names {duplicates} more than once")
    return names


def _positive_int(value: Any, parameter: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{parameter} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{parameter} must be >= {minimum}, got {value}")
    return int(value)


def _pair(value: Any, parameter: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise ValueError(f"{parameter} must be an int or a pair [x, y], got {value!r}")
        return _positive_int(value[0], parameter), _positive_int(value[1], parameter)
    return _positive_int(value, parameter), 1


def _scheme(
    column: Any, scheme: Any, column_name: str, scheme_name: str
) -> tuple[str | None, SchemeValues | None]:
    if column is None:
        if scheme is not None:
            raise ValueError(f"{scheme_name} was given without {column_name}: name the column it splits")
        return None, None
    if not isinstance(column, str) or not column.strip():
        raise TypeError(f"{column_name} must be a column name or SQL expression string, got {column!r}")
    if scheme is None:
        return column, None
    if isinstance(scheme, (str, bytes)) or not isinstance(scheme, (Sequence, np.ndarray)):
        raise TypeError(f"{scheme_name} must be a list of values, got {type(scheme).__name__} {scheme!r}")
    values = tuple(v.item() if isinstance(v, np.generic) else v for v in scheme)
    if not values:
        raise ValueError(f"{scheme_name} is empty: give at least one value, or None to discover them")
    repeated = _repeated(values)
    if repeated:
        raise ValueError(f"{scheme_name} lists {repeated!r} more than once: its rows would load twice")
    if any(v is None for v in values):
        # SQL's NULL = NULL is never true, so a None value would silently select no rows.
        raise ValueError(
            f"{scheme_name} contains None, which matches no row; "
            f"COALESCE {column_name} in the query to load NULL rows"
        )
    return column, values


def _repeated(values: SchemeValues) -> list[Any]:
    seen: set[Any] = set()
    repeated: list[Any] = []
    for value in values:
        try:
            if value in seen and value not in repeated:
                repeated.append(value)
            seen.add(value)
        except TypeError:  # unhashable: the engine rejects it as a parameter anyway
            continue
    return repeated


def _numpy_dtype(dtype: Any, parameter: str) -> np.dtype[Any] | None:
    if dtype is None:
        return None
    try:
        translated = numpy_dtype(dtype)
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{parameter}={dtype!r} has no numpy equivalent; use e.g. torch.float32") from exc
    if translated.kind not in "biuf":
        raise TypeError(f"{parameter}={dtype!r} is not a numeric dtype; use e.g. torch.float32")
    return translated


def _dtypes(dtype: Any) -> tuple[np.dtype[Any] | None, np.dtype[Any] | None]:
    if isinstance(dtype, tuple):
        if len(dtype) != 2:
            raise ValueError(f"dtype must be one dtype or a pair (x_dtype, y_dtype), got {dtype!r}")
        return _numpy_dtype(dtype[0], "dtype[0]"), _numpy_dtype(dtype[1], "dtype[1]")
    both = _numpy_dtype(dtype, "dtype")
    return both, both


def default_device() -> torch.device:
    """torch's default device (``torch.set_default_device``), the CPU unless changed."""
    get_default = getattr(torch, "get_default_device", None)  # torch >= 2.3
    return torch.device("cpu") if get_default is None else torch.device(get_default())


def _device(device: Any) -> torch.device:
    if device is None:
        return default_device()
    try:
        resolved = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device: {exc}") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} needs CUDA, which this machine does not have")
    return resolved


def _pin(pin_memory: bool | Literal["auto"], device: torch.device) -> bool:
    if pin_memory == "auto":
        return torch.cuda.is_available()
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be True, False or 'auto', got {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs a CUDA device; use pin_memory='auto' on CPU-only machines")
    return pin_memory


def normalise_config(args: Mapping[str, Any]) -> LoaderConfig:
    """Validate the user's arguments (already alias-resolved) into a :class:`LoaderConfig`."""
    target = _names(args["target_col"], "target_col", allow_none=False)
    assert target is not None
    windows = _pair(args["window_size"], "window_size")
    strides = _pair(args["window_stride"], "window_stride")
    if strides is not None and windows is None:
        warn_caller(
            f"window_stride={args['window_stride']!r} is ignored without window_size "
            f"(as in DolphinDB): every row is a sample"
        )
        strides = None
    input_col = _names(args["input_col"], "input_col", allow_none=True)
    exclude_col = _names(args["exclude_col"], "exclude_col", allow_none=True, allow_empty=True) or ()
    if input_col is not None and exclude_col:
        warn_caller(
            f"exclude_col={list(exclude_col)} is ignored because input_col is given (as in DolphinDB): "
            f"x is exactly input_col"
        )
        exclude_col = ()
    x_window, y_window = windows if windows is not None else (1, 1)
    stride = strides[0] if strides is not None else 1
    offset_arg = args["offset"]
    if offset_arg is None:
        offset = x_window if windows is not None else 0
    else:
        if isinstance(offset_arg, bool) or not isinstance(offset_arg, (int, np.integer)):
            raise TypeError(f"offset must be an int, got {type(offset_arg).__name__} {offset_arg!r}")
        if offset_arg < 0:
            raise ValueError(f"offset must be >= 0 (y may not precede x), got {offset_arg}")
        offset = int(offset_arg)
    group_col, group_scheme = _scheme(args["group_col"], args["group_scheme"], "group_col", "group_scheme")
    repartition_col, repartition_scheme = _scheme(
        args["repartition_col"], args["repartition_scheme"], "repartition_col", "repartition_scheme"
    )
    seed = args["seed"]
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative int or None, got {type(seed).__name__} {seed!r}")
    elif seed < 0:
        raise ValueError(f"seed must be a non-negative int or None, got {seed}")
    device = _device(args["device"])
    timeout = args["timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    backoff = args["retry_backoff"]
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"retry_backoff must be a number of seconds, got {type(backoff).__name__} {backoff!r}"
        )
    if not math.isfinite(backoff) or backoff < 0:
        raise ValueError(f"retry_backoff must be a finite number of seconds >= 0, got {backoff!r}")
    for flag in ("shuffle", "drop_last", "window_on_device", "verify"):
        if not isinstance(args.get(flag, False), (bool, np.bool_)):
            raise TypeError(f"{flag} must be a bool, got {args[flag]!r}")
    x_dtype, y_dtype = _dtypes(args["dtype"])
    return LoaderConfig(
        target_col=target,
        batch_size=_positive_int(args["batch_size"], "batch_size"),
        shuffle=bool(args["shuffle"]),
        windowed=windows is not None,
        x_window=x_window,
        y_window=y_window,
        stride=stride,
        offset=offset,
        input_col=input_col,
        exclude_col=exclude_col,
        group_col=group_col,
        group_scheme=group_scheme,
        repartition_col=repartition_col,
        repartition_scheme=repartition_scheme,
        seed=int(seed),
        drop_last=bool(args["drop_last"]),
        device=device,
        pin_memory=_pin(args["pin_memory"], device),
        prefetch_batch=_positive_int(args["prefetch_batch"], "prefetch_batch", minimum=0),
        prepartition_num=_positive_int(args["prepartition_num"], "prepartition_num"),
        # None: sized from the plan once it is built (ddbloader._epoch.schedule.pool_size); 0 until then
        group_pool_size=0
        if args["group_pool_size"] is None
        else _positive_int(args["group_pool_size"], "group_pool_size"),
        fetch_threads=_positive_int(args["fetch_threads"], "fetch_threads"),
        x_dtype=x_dtype,
        y_dtype=y_dtype,
        timeout=float(timeout),
        retries=_positive_int(args["retries"], "retries", minimum=0),
        retry_backoff=float(backoff),
        transform=args["transform"],
        collate=_collate(args["collate"]),
        window_on_device=bool(args["window_on_device"]),
        fetch_bytes=_positive_int(args["fetch_bytes"], "fetch_bytes", minimum=0),
        cache_bytes=None
        if args.get("cache_bytes") is None
        else _positive_int(args["cache_bytes"], "cache_bytes", minimum=0),
        key_col=_names(args["key_col"], "key_col", allow_none=True) or (),
        verify=bool(args.get("verify", False)),
        **split_args(
            args.get("split_col"), args.get("split_range"), windows is not None, x_window, y_window, offset
        ),
    )


def _collate(value: Any) -> Collate | None:
    if value is not None and not callable(value):
        raise TypeError(f"collate must be a callable taking and returning an (x, y) batch, got {value!r}")
    collate: Collate | None = value
    return collate
