"""DDBDataLoader: arguments, epochs, ``len``, iteration and shutdown."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch

from .backends import Backend, connect
from .batch import batch_count, gather
from .config import LoaderConfig, normalise_config, resolve_aliases
from .fetch import Fetcher
from .manager import GroupPool
from .plan import QueryPlan, build_plan
from .prefetch import Prefetcher

__all__ = ["DDBDataLoader"]

_log = logging.getLogger("ddbloader")

Batch = tuple[torch.Tensor, torch.Tensor]


class _EpochBatches:
    """The batches of one epoch, assembled in the calling (assembler) thread.

    Its fetch threads stop in ``close()``, never on a failure: the driver reports the failure
    first and closes after, so a slow join (a fetch stuck in the engine) cannot delay the error
    past the consumer's own timeout and replace it with a vaguer one.
    """

    def __init__(
        self, plan: QueryPlan, config: LoaderConfig, backend: Backend, epoch: int, stop: threading.Event
    ) -> None:
        self._fetcher = Fetcher(backend, plan.layout, config.fetch_threads)
        self._batches = self._assemble(plan, config, epoch, stop)

    def _assemble(
        self, plan: QueryPlan, config: LoaderConfig, epoch: int, stop: threading.Event
    ) -> Iterator[Batch]:
        pool = GroupPool(plan, config, epoch, self._fetcher, stop)
        left = plan.samples
        for _ in range(batch_count(plan.samples, config.batch_size, config.drop_last)):
            size = min(config.batch_size, left)
            left -= size
            yield gather(pool.take(size), plan.geometry, plan.layout, config.pin_memory)

    def __iter__(self) -> _EpochBatches:
        return self

    def __next__(self) -> Batch:
        return next(self._batches)

    def close(self) -> None:
        self._fetcher.close()


class _EpochIterator:
    """One pass over the plan. Single consumer; ``close()`` (or GC) stops its threads.

    Holds its loader, so ``for batch in DDBDataLoader(...)`` does not free (and close) the loader.
    """

    def __init__(
        self,
        loader: DDBDataLoader,
        plan: QueryPlan,
        config: LoaderConfig,
        backend: Backend,
        epoch: int,
        total: int,
    ) -> None:
        self._loader = loader
        self.epoch = epoch
        self._config = config
        self._total = total
        self.yielded = 0
        self._started = time.perf_counter()
        prefetcher: Prefetcher[Batch] = Prefetcher(
            functools.partial(_EpochBatches, plan, config, backend, epoch),
            depth=config.prefetch_batch,
            name="ddbloader-assemble",
            timeout=2 * config.timeout,
        )
        self._prefetcher = prefetcher
        self._close = weakref.finalize(self, prefetcher.close)

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self._total - self.yielded

    def __next__(self) -> Batch:
        try:
            x, y = next(self._prefetcher)
        except StopIteration:
            if self._close.alive:
                elapsed = time.perf_counter() - self._started
                _log.info("epoch %d done: %d batches in %.2f s", self.epoch, self.yielded, elapsed)
            self.close()
            raise
        except BaseException:
            self.close()
            raise
        self.yielded += 1
        device = self._config.device
        if device.type != "cpu":
            x = x.to(device, non_blocking=self._config.pin_memory)
            y = y.to(device, non_blocking=self._config.pin_memory)
        return x, y

    def close(self) -> None:
        self._close()


class DDBDataLoader:
    """Feed PyTorch from a SQL query: split it into subqueries, fetch in the background, yield batches.

    Semantics (see README): groups never mix inside a sample; windows continue across the
    repartitions of a group; every sample appears exactly once per epoch; the batch sequence is a
    pure function of (query, arguments, seed, epoch). Iterating again starts the next epoch.

    Thread-safety: one consumer thread per loader. Starting a new iteration closes the previous
    one. ``close()`` (or ``with``) releases threads and the connection the loader opened.

    Args:
        source: a DuckDB connection, a DuckDB database path (opened read-only) or ``None``.
        sql: one read-only query.
        target_col: the column(s) of y.
        batch_size: samples per batch.
        shuffle: random group, partition and sample order, and batches drawn across groups.
        window_size: ``n`` or ``[x_rows, y_rows]``; ``None`` means one row per sample.
        window_stride: rows between sample starts (a second value is accepted and ignored).
        input_col: the columns of x, in order; default: every numeric column.
        exclude_col: columns left out of x.
        repartition_col / repartition_scheme: split each group further (a column or SQL
            expression, and its values in order; ``None`` discovers them).
        group_col / group_scheme: one time series per value (``None`` discovers them).
        seed: makes the order reproducible; ``None`` draws one.
        drop_last: drop the final partial batch.
        offset: rows from a sample's first x row to its first y row (default: the x window).
        device: where batches are delivered.
        prefetch_batch: batches assembled ahead (0 assembles in the consumer's thread).
        prepartition_num: partitions per active group held at once (the one being served too).
        group_pool_size: groups active at once.
        dtype: dtype of x and y, or a pair ``(x_dtype, y_dtype)``; default: numpy promotion.
        pin_memory: ``"auto"`` pins host batches when CUDA is available.
        fetch_threads: partition fetch threads, each with its own cursor.
        timeout: seconds any single wait (a fetch, a batch) may take before TimeoutError.
        **aliases: DolphinDB's camelCase names (``targetCol``, ``batchSize``, ...).
    """

    def __init__(
        self,
        source: Any,
        sql: str,
        target_col: str | Sequence[str] | None = None,
        batch_size: int = 1,
        shuffle: bool = False,
        window_size: int | Sequence[int] | None = None,
        window_stride: int | Sequence[int] | None = None,
        *,
        input_col: str | Sequence[str] | None = None,
        exclude_col: str | Sequence[str] | None = None,
        repartition_col: str | None = None,
        repartition_scheme: Sequence[Any] | None = None,
        group_col: str | None = None,
        group_scheme: Sequence[Any] | None = None,
        seed: int | None = None,
        drop_last: bool = False,
        offset: int | None = None,
        device: str | torch.device = "cpu",
        prefetch_batch: int = 1,
        prepartition_num: int = 2,
        group_pool_size: int = 3,
        dtype: Any = None,
        pin_memory: bool | Literal["auto"] = "auto",
        fetch_threads: int = 2,
        timeout: float = 300.0,
        **aliases: Any,
    ) -> None:
        explicit = {
            k: v for k, v in locals().items() if k not in {"self", "source", "sql", "aliases", "__class__"}
        }
        args = resolve_aliases(explicit, _DEFAULTS, aliases)
        self.config = normalise_config(args)
        self._backend = connect(source)
        try:
            self.plan = build_plan(self._backend, sql, self.config)
        except BaseException:
            self._backend.close()
            raise
        self.sql = sql
        self._epoch = 0
        self._iterator: weakref.ref[_EpochIterator] | None = None
        self._closed = False
        self._len = batch_count(self.plan.samples, self.config.batch_size, self.config.drop_last)

    def __len__(self) -> int:
        return self._len

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (its order is a function of seed and epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._epoch = epoch

    def __iter__(self) -> _EpochIterator:
        if self._closed:
            raise RuntimeError("this DDBDataLoader is closed")
        self._close_iterator()
        iterator = _EpochIterator(self, self.plan, self.config, self._backend, self._epoch, self._len)
        _log.info(
            "epoch %d: %d groups, %d partitions, %d samples, %d batches",
            self._epoch,
            len(self.plan.groups),
            self.plan.partitions,
            self.plan.samples,
            self._len,
        )
        self._epoch += 1
        self._iterator = weakref.ref(iterator)
        return iterator

    def _close_iterator(self) -> None:
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.close()
        self._iterator = None

    def close(self) -> None:
        """Stop the running iteration (downstream first) and close what the loader opened."""
        if self._closed:
            return
        self._closed = True
        self._close_iterator()
        self._backend.close()

    def __enter__(self) -> DDBDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        plan, config = self.plan, self.config
        x_shape = [
            config.batch_size,
            *([config.x_window] if config.windowed else []),
            len(plan.layout.x_names),
        ]
        y_shape = [
            config.batch_size,
            *([config.y_window] if config.windowed else []),
            len(plan.layout.y_names),
        ]
        return (
            f"DDBDataLoader(engine={plan.engine!r}, groups={len(plan.groups)}, partitions={plan.partitions}, "
            f"rows={plan.rows}, samples={plan.samples}, batches={self._len}, "
            f"x={x_shape} {plan.layout.x_dtype}, "
            f"y={y_shape} {plan.layout.y_dtype}, shuffle={config.shuffle}, seed={config.seed})"
        )


_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(DDBDataLoader.__init__).parameters.items()
    if name not in {"self", "source", "sql", "aliases"}
}
