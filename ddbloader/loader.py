"""DDBDataLoader: arguments, epochs, ``len``, iteration and shutdown.

Its private bases hold the rest, each sharing the loader's attributes: how its iterations claim,
report and give back epochs (:mod:`ddbloader._claims`), its checkpoints (``state_dict`` and
``load_state_dict``, :mod:`ddbloader._checkpoint`), and what it holds in its process, reopened in
a worker process (:mod:`ddbloader._resources`). Its argument bookkeeping and the connections of
its ``from_*`` constructors are in :mod:`ddbloader._construction`; the attributes frameworks read
from a DataLoader (``batch_size``, ``dataset``, ``sampler``, ...) are :mod:`ddbloader._samples`.
"""

from __future__ import annotations

import inspect
import itertools
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ._checkpoint import LoaderCheckpoint
from ._claims import Iteration
from ._construction import NO_SOURCE, LoaderConstructors, records_given_arguments
from ._core.config import normalise_config, resolve_aliases
from ._core.display import plan_html, plan_text
from ._core.errors import warn_caller
from ._diagnostics.mixing import MixingWatch
from ._diagnostics.summary import plan_rows
from ._epoch.elastic import Stretch
from ._epoch.shard import Sharding, resolve_sharding
from ._epoch.state import Resume
from ._modes import Handover, tf_dataset
from ._pipeline.arena import Arena
from ._pipeline.epoch import EpochIterator
from ._resources import LoaderResources, replans
from ._samples import DataLoaderFace
from ._sql.plan import WorkUnit
from .backends import Backend, connect
from .stats import LoaderStats, StatsRecorder
from .transforms import as_pipeline

__all__ = ["DDBDataLoader"]

Batch = tuple[torch.Tensor, torch.Tensor]


class DDBDataLoader(DataLoaderFace, LoaderCheckpoint, LoaderResources, LoaderConstructors):
    """Feed PyTorch from a SQL query: split it into subqueries, fetch in the background, yield batches.

    Semantics (see the Concepts page of the docs): groups never mix inside a sample; windows
    continue across the repartitions of a group; every sample appears exactly once per epoch; the
    batch sequence is a pure function of (query, arguments, seed, epoch). Iterating again starts
    the next epoch.

    Thread-safety: one consumer thread per loader; ``iter()`` from a second thread while the
    first one's iteration runs raises RuntimeError. Starting a new iteration stops the previous
    one, whose next step then raises RuntimeError (never a StopIteration that would end a training
    loop early), as does a step after ``close()``. ``close()`` (or ``with``) releases threads and
    the connection the loader opened; it may be called from any thread.

    Args:
        source: a DuckDB connection, a DuckDB database path (opened read-only), ``None`` (an
            in-memory DuckDB), a URI, a connection, a factory or a backend (see Data sources).
        sql: one read-only query.
        target_col: the column(s) of y.
        batch_size: samples per batch.
        shuffle: random group, partition and sample order, and batches drawn across groups.
        window_size: ``n`` or ``[x_rows, y_rows]``; ``None`` means one row per sample.
        window_stride: rows between sample starts (a second value is accepted and ignored).
        input_col: the columns of x, in order; default: every numeric column, less target_col
            without windows (DolphinDB keeps it: name it here to feed it).
        exclude_col: columns left out of x.
        repartition_col: split each group further by this column or SQL expression.
        repartition_scheme: the repartition values, in order; ``None`` discovers them.
        group_col: one time series per value of this column or SQL expression.
        group_scheme: the group values; ``None`` discovers them.
        seed: makes the order reproducible; ``None`` draws one.
        drop_last: drop the final partial batch.
        offset: rows from a sample's first x row to its first y row (default: the x window).
        device: where batches are delivered; ``None`` means torch's default device.
        prefetch_batch: batches assembled ahead in a thread (0: in the consumer's thread, as
            also while most of the consumer's steps take under 50 µs).
        prepartition_num: partitions per active group held at once (the one being served too).
        group_pool_size: groups active at once; a batch draws its samples uniformly from them.
            ``None`` (with shuffle): as many as a batch has samples, so that a batch mixes series
            like a uniform shuffle, as long as that many of the largest partitions take at most
            24 MiB and a quarter of the rows (see ``ddbloader._epoch.schedule.pool_size``); at
            least 3; without shuffle, 3. ``3`` is DolphinDB's pool.
        dtype: dtype of x and y, or a pair ``(x_dtype, y_dtype)``; default: the columns' common type,
            a floating one in ``torch.get_default_dtype()`` (float32): integer-only x or y keeps its
            integer type, integers with NULLs become floating with NaN. DolphinDB's float64 for
            DOUBLE columns: ``dtype=torch.float64``.
        pin_memory: ``"auto"`` pins host batches when CUDA is available; never in a DataLoader
            worker process (give the DataLoader ``pin_memory=True``: it pins in the main process).
        fetch_threads: partition fetch threads, each with its own cursor.
        timeout: seconds any single wait (a fetch, a batch) may take before TimeoutError.
        retries: further attempts of a partition fetch that failed on a transient error (a
            network error, or what the backend's ``is_transient`` accepts), each on a fresh cursor.
        retry_backoff: seconds before the first retry; the wait doubles after every attempt.
        progress: show a progress bar while planning (counting the subqueries) once it has
            taken longer than a second.
        transform: a function (or list of functions) applied to every fetched partition in the
            fetch threads: Arrow table (or dict of tensors) in, the same rows out; the columns
            named by input_col/target_col are those of its output (see ddbloader.transforms).
        collate: a function applied to each assembled ``(x, y)`` batch in the background; it
            returns an ``(x, y)`` pair of tensors.
        window_on_device: ship each partition's rows to the device once and build the windows
            there, instead of copying every window's rows (see ddbloader._pipeline.device).
        fetch_bytes: byte budget of one fetch unit: partitions whose planned rows (times the width
            of a converted row) fit in it together are fetched by one query, with their group values
            bound as an IN list, and split by key on arrival (see ddbloader._epoch.units). An
            epoch's first unit gets an eighth of it, and a larger group among the pool's first is
            fetched as two units, its first ``prepartition_num`` partitions and the rest (the first
            batch waits for small queries). The rows of a unit wait until their partitions are
            claimed: the units holding the groups being served (and those claimed ahead) and the
            unit after them are held, each at most ``fetch_bytes``. A partition larger than the
            budget is streamed: planned as consecutive pieces of at most ``fetch_bytes`` (or 64 rows
            if more) read by one query as they are served (see ddbloader._io.streams); with
            ``shuffle``, cut instead into range pieces of its ORDER BY key, each read by its own
            query and visited in a random order (see ddbloader._sql.pieces); two neighbouring combed
            pieces the loader orders itself are read by one query, a unit of up to twice the budget
            (see ddbloader._sql.piece_tags). 0 fetches every partition on its own and whole.
        cache_bytes: keep the partitions fetched in the first epoch in memory and serve later
            epochs from there, without querying again, when the planned partitions (rows ×
            bytes per row of x and y) fit in this many bytes; else a warning, and no cache.
            ``None`` (the default) never caches: the data may change between epochs. An epoch
            served from the cache to the CPU is assembled in the consumer's thread (nothing to
            wait for; a hand-over per batch between threads cost about what its gather does).
        key_col: column(s) of any type whose values at each sample's first y row (its row
            without windows) come with the batch as a third element, a dict name → tensor (numbers;
            temporal values as int64 since the epoch) or list (strings and other types), so
            predictions can be joined back (see ddbloader.keys). Left out of a derived x.
        verify: check every fetched partition's rows, not only their count, against an engine
            hash of each row summed at planning (DuckDB, PostgreSQL, ClickHouse, Spark;
            refused elsewhere): wrong rows in the right number raise, naming the partition.
            Costs a hash per row at planning and at every fetch (see the Reliability page of the docs).
        split_col: with ``split_range=(lo, hi)`` (either end None), serve exactly the samples whose
            y rows all have ``lo <= split_col < hi``, x looking back before ``lo`` (see :meth:`split`
            and the Splits page of the docs).
        replan: ``"never"`` (the default): one plan, and on PostgreSQL one snapshot, from
            construction to ``close()``. ``"epoch"``: each iteration that starts a new epoch,
            once the current plan has served one, plans again on what is committed then (on
            PostgreSQL a fresh snapshot; under DDP rank 0's, shared), so an epoch sees the rows
            written before it. Once an epoch ended, the next epoch's first ``len()`` plans it as
            ``iter()`` would, so ``len()`` before ``iter()`` counts it (see :meth:`batches` and
            the PostgreSQL page of the docs). Refused with ``cache_bytes`` and in DataLoader
            worker processes.
        mode: the same batches as ``"pytorch"``, ``"numpy"``, ``"jax"`` or ``"tensorflow"`` arrays.
        verbose: accepted for DolphinDB code and ignored: ddbloader reports through the
            ``"ddbloader"`` logger (INFO per epoch, DEBUG per partition).
        **aliases: DolphinDB's camelCase names (``ddbSession``, ``targetCol``, ``batchSize``, ...).
    """

    _given_arguments: frozenset[str]

    @records_given_arguments
    def __init__(
        self,
        source: Any = NO_SOURCE,
        sql: str = "",
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
        device: str | torch.device | None = "cpu",
        prefetch_batch: int = 1,
        prepartition_num: int = 2,
        group_pool_size: int | None = None,
        dtype: Any = None,
        pin_memory: bool | Literal["auto"] = "auto",
        fetch_threads: int = 2,
        timeout: float = 300.0,
        retries: int = 2,
        retry_backoff: float = 0.1,
        rank: int | None = None,
        world_size: int | None = None,
        even_batches: str = "pad",
        progress: bool = False,
        transform: Any = None,
        collate: Callable[[Batch], Batch] | None = None,
        window_on_device: bool = False,
        fetch_bytes: int = 8 * 2**20,
        cache_bytes: int | None = None,
        key_col: str | Sequence[str] | None = None,
        verify: bool = False,
        split_col: str | None = None,
        split_range: tuple[Any, Any] | None = None,
        replan: str = "never",
        mode: str = "pytorch",
        verbose: bool = False,
        **aliases: Any,
    ) -> None:
        explicit = {k: v for k, v in locals().items() if k not in {"self", "aliases", "__class__"}}
        args = resolve_aliases(explicit, _DEFAULTS, aliases, self._given_arguments)
        source = args["source"]
        if source is NO_SOURCE:
            raise TypeError("DDBDataLoader() needs a source: a connection, a path, a URI or None")
        self._handover = Handover(args, self._given_arguments)
        if not isinstance(verbose, bool):
            raise TypeError(f"verbose must be a bool, got {type(verbose).__name__} {verbose!r}")
        args.update(self._handover.torch_arguments)
        self.config = normalise_config({**args, "transform": as_pipeline(args["transform"])})
        # validates the arguments; the sharding an epoch uses is read when it starts
        built = resolve_sharding(rank, world_size, even_batches)
        self._fixed_sharding = built if rank is not None or world_size is not None else None
        self._even_batches = built.even_batches
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool, got {type(progress).__name__} {progress!r}")
        self._seed_given = args["seed"] is not None
        self._replans, self._plan_served, self._serving = replans(replan, self.config), False, False
        self._pool_given = self.config.group_pool_size
        self._agreed_world = 1
        self._source = source
        self._backend_pid = os.getpid()
        self._backend: Backend | None = connect(source)
        self.sql = sql
        try:
            self._follow_rank0(built)
            self._plan_now(self._backend, sql, progress)
        except BaseException:
            self._backend.close()
            raise
        self._agree(built)
        self._epoch = 0
        #: where a loaded state (or a peek given back) stopped in epoch ``_epoch``, until it starts
        self._resume: Resume | None = None
        #: where the latest iteration's epoch started: its earlier stretches and this stretch's world
        self._running: Resume | None = None
        #: the remainder of an elastically resumed epoch, by (epoch, seed, stretches)
        self._left: tuple[tuple[int, int, tuple[Stretch, ...]], list[WorkUnit]] | None = None
        self._progress: tuple[int, int, bool] | None = None
        self._iterator: weakref.ref[EpochIterator] | None = None
        self._recorder: StatsRecorder | None = None
        self._mixing = MixingWatch(self.plan, self.config)
        self._closed = False
        self._arena: Arena | None = None
        self._cache = self._partition_cache()
        #: an unfinished iteration that has handed out only its first batch: (token, epoch, place)
        self._peek: tuple[int, int, Resume] | None = None
        self._tokens = itertools.count()

    def __len__(self) -> int:
        """The batches the next iteration yields on this rank (the same on every rank): a whole
        epoch under the current world size, or after ``load_state_dict`` the rest of the resumed
        epoch, whatever world size saved it (see :meth:`batches`)."""
        return self.batches()

    @property
    def sharding(self) -> Sharding:
        """This process's rank and world size now: the explicit ones, else torch.distributed's."""
        if self._fixed_sharding is not None:
            return self._fixed_sharding
        return resolve_sharding(None, None, self._even_batches)

    def batches(self, num_workers: int = 1) -> int:
        """The batches the next iteration yields on this rank when its share is split over
        ``num_workers`` workers: a whole epoch's, or after ``load_state_dict`` the rest of the
        resumed epoch (under the saving world: the batches after the saved one; under another
        world size or worker count: this rank's share of the samples no old rank handed out).

        Under ``replan="epoch"``, once the current plan has served an epoch and its iteration
        ended, the first ``batches()`` (``len()``) or ``iter()`` of the next epoch plans it (a
        collective under DDP: call it on every rank), so it counts the batches that epoch yields.
        """
        self._replan_before_len()
        return self._next_batches(num_workers)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch that starts (the next first batch) ``epoch``; its order is a function of
        seed and epoch.

        In DataLoader worker mode call it before every epoch, as with ``DistributedSampler``:
        worker processes iterate copies, so the original cannot count epochs itself. Setting the
        epoch that runs next anyway changes nothing, so ``load_state_dict`` followed by
        ``set_epoch`` of the saved epoch still resumes mid-epoch; another epoch starts afresh.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._give_back(None)
        if epoch == self._epoch:
            return
        if self._resume is not None and self._resume.started:
            # a framework may call set_epoch itself (Accelerate's loaders do, counting from 0 in a
            # restarted process): say that the loaded position is dropped, never drop it silently
            warn_caller(
                f"set_epoch({epoch}) drops the position load_state_dict restored in epoch {self._epoch}: "
                f"epoch {epoch} starts from its first batch. To resume, call set_epoch({self._epoch}) "
                f"(or nothing) before iterating"
            )
        self._epoch = epoch
        self._resume = None
        self._progress = None

    def __iter__(self) -> EpochIterator:
        return self.iterate()

    def iterate(
        self, worker: int = 0, num_workers: int = 1, claimed: Callable[[int], None] | None = None
    ) -> EpochIterator:
        """An iteration for one of ``num_workers`` workers (``iter(loader)`` is worker 0 of 1).

        It claims the next epoch at its first batch (then calls ``claimed(epoch)``); an iteration
        abandoned after its first batch only (a peek) gives its epoch back.
        """
        if self._closed:
            raise RuntimeError("this DDBDataLoader is closed")
        previous = self._iterator() if self._iterator is not None else None
        owner = previous.owner_elsewhere() if previous is not None else None
        if owner is not None:
            raise RuntimeError(
                f"this DDBDataLoader is being iterated by thread {owner.name!r}: a loader serves one "
                f"consumer thread at a time; give each thread its own loader, or let that iteration "
                f"finish (or close it) first"
            )
        self._stop_iterator(
            "this DDBDataLoader iteration was superseded: iter(loader) was called again before it "
            "ended, which starts the next epoch and stops this one (to look at a batch inside the "
            "loop, keep the one you have; for shapes see loader.plan)"
        )
        self._give_back(None)
        self._replan_if_due()
        iteration = Iteration(self, next(self._tokens), worker, num_workers, claimed)
        iterator = self._handover.iterator(iteration)
        weakref.finalize(iterator, self._give_back, iteration.token).atexit = False
        self._iterator = weakref.ref(iterator)
        if self._resume is not None and self._resume.started and not len(iterator):
            # a state saved at the end of its epoch: that epoch is over, whether this iterator
            # is stepped or dropped (StatefulDataLoader restores one it never steps)
            iterator.start()
        return iterator

    def as_tf_dataset(self) -> Any:
        """The batches as a ``tf.data.Dataset`` (see :func:`ddbloader._modes.tf_dataset`)."""
        return tf_dataset(self)

    def stats(self) -> LoaderStats:
        """Throughput of the current (or last) epoch; renders as a table in Jupyter."""
        if self._recorder is None:
            raise RuntimeError("no epoch has started yet: iterate the loader first")
        return self._recorder.snapshot()

    def close(self) -> None:
        """Stop the running iteration (downstream first) and close what the loader opened."""
        if self._closed:
            return
        self._closed = True
        self._stop_iterator("the DDBDataLoader was closed (loader.close()) during this iteration")
        if self._backend is not None and self._backend_pid == os.getpid():
            self._backend.close()

    def release(self) -> None:
        """DolphinDB's name for :meth:`close`."""
        self.close()

    def __enter__(self) -> DDBDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def _plan_rows(self) -> list[tuple[str, str]]:
        return plan_rows(self.plan, self.config, self.sharding, self._next_batches(1))

    def __repr__(self) -> str:
        return plan_text(self._plan_rows())

    def _repr_html_(self) -> str:
        layout = self.plan.layout
        return plan_html(self._plan_rows(), {"x": layout.x_names, "y": layout.y_names})


_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(DDBDataLoader.__init__).parameters.items()
    if name not in {"self", "aliases"}
}
