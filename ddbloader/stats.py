"""Throughput figures of an epoch: what the consumer waited for, what the fetches cost.

:class:`StatsRecorder` is written by the fetch threads and the consumer (thread-safe) and read
as an immutable :class:`LoaderStats` snapshot, which prints as text and renders as HTML.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, fields

from ._core.display import CELL_STYLE, LABEL_STYLE, html_rows, html_table, human_bytes
from ._diagnostics.mixing import EpochMixing

__all__ = ["LOADER_BOUND", "MODEL_BOUND", "LoaderStats", "StatsRecorder"]

#: Starvation at or above this share of wall time: the loader is the bottleneck.
LOADER_BOUND = 0.5
#: Starvation at or below this share: the model (the consumer) is the bottleneck.
MODEL_BOUND = 0.1


@dataclass(frozen=True, repr=False)
class LoaderStats:
    """A snapshot of one epoch's throughput.

    ``starvation`` is the share of the epoch's wall time the consumer spent waiting for a batch:
    near 0 means the model is the bottleneck, near 1 means the loader is. ``queries`` counts the
    partition queries sent so far this epoch (a fetch unit brings many partitions in one query).
    With ``shuffle=True``, ``partitions_per_batch`` and ``rank_correlation`` say how well the
    epoch mixes its rows (see :mod:`ddbloader._diagnostics.mixing`; NaN without shuffle).
    """

    epoch: int
    batches: int
    samples: int
    seconds: float
    samples_per_second: float
    consumer_wait_seconds: float
    starvation: float
    partitions_fetched: int
    fetch_seconds_per_partition: float
    mean_queue_depth: float
    bytes_moved: int
    queries: int = 0
    rows_per_query: float = 0.0
    partitions_per_batch: float = math.nan
    rank_correlation: float = math.nan

    @property
    def verdict(self) -> str:
        """Which side is the bottleneck, judged by :attr:`starvation`."""
        if self.batches == 0:
            return "no batch delivered yet"
        if self.starvation >= LOADER_BOUND:
            return (
                "loader-bound: the training loop waited for data most of the time "
                "(more fetch_threads or prefetch_batch, larger partitions, or a cheaper query help)"
            )
        if self.starvation <= MODEL_BOUND:
            return "model-bound: batches were ready when asked for; the loader is not the bottleneck"
        return "balanced: the loop waited for data part of the time"

    def rows(self) -> list[tuple[str, str]]:
        """(label, formatted value) pairs, in display order."""
        return [
            ("epoch", str(self.epoch)),
            ("batches", f"{self.batches:,}"),
            ("samples", f"{self.samples:,}"),
            ("wall time", f"{self.seconds:.2f} s"),
            ("samples/s", f"{self.samples_per_second:,.0f}"),
            ("consumer waited", f"{self.consumer_wait_seconds:.2f} s ({self.starvation:.0%} starvation)"),
            ("partitions fetched", f"{self.partitions_fetched:,}"),
            ("queries", f"{self.queries:,} ({self.rows_per_query:,.0f} rows per query)"),
            ("fetch time / partition", f"{self.fetch_seconds_per_partition * 1000:.1f} ms"),
            ("mean queue depth", f"{self.mean_queue_depth:.2f}"),
            (
                "bytes moved",
                f"{human_bytes(self.bytes_moved)} ({human_bytes(self.bytes_moved / self.seconds)}/s)",
            ),
            ("verdict", self.verdict),
            *(
                []
                if math.isnan(self.rank_correlation)
                else [
                    (
                        "mixing",
                        f"{self.partitions_per_batch:g} partitions per batch, rank correlation "
                        f"{self.rank_correlation:+.2f} (0: no trace of row order)",
                    )
                ]
            ),
        ]

    def __str__(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"{label:<{width}}  {value}" for label, value in self.rows())

    def __repr__(self) -> str:
        # The table itself: it is what a REPL or a notebook without HTML shows for loader.stats().
        return f"LoaderStats:\n{self}"

    def _repr_html_(self) -> str:
        # A bar under the wait makes the starvation share readable at a glance.
        rows = self.rows()[1:]  # the epoch goes into the caption
        split = next(i for i, (label, _) in enumerate(rows) if label == "consumer waited") + 1
        if self.starvation >= LOADER_BOUND:
            colour = "#d9534f"
        elif self.starvation > MODEL_BOUND:
            colour = "#f0ad4e"
        else:
            colour = "#5cb85c"
        bar = (
            f"<tr><th style='{LABEL_STYLE}'>starvation</th><td style='{CELL_STYLE}'>"
            "<div style='display:inline-block;width:160px;height:10px;background:#ddd;vertical-align:middle'>"
            f"<div style='width:{self.starvation * 100:.1f}%;height:10px;background:{colour}'></div>"
            f"</div> {self.starvation:.0%}</td></tr>"
        )
        body = html_rows(rows[:split]) + bar + html_rows(rows[split:])
        return html_table(f"ddbloader stats, epoch {self.epoch}", body)

    def as_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StatsRecorder:
    """Accumulates one epoch's figures. Thread-safe."""

    def __init__(self, epoch: int, mixing: EpochMixing | None = None) -> None:
        self._lock = threading.Lock()
        self._epoch = epoch
        self._mixing = mixing
        self._started = time.perf_counter()
        self._batches = 0
        self._samples = 0
        self._wait = 0.0
        self._fetches = 0
        self._queries = 0
        self._rows = 0
        self._fetch_seconds = 0.0
        self._depth_total = 0
        self._bytes = 0
        self._ended: float | None = None

    @property
    def started(self) -> float:
        """When the epoch's clock started (``time.perf_counter()``): its wall time counts from here."""
        return self._started

    def finish(self) -> None:
        """Freeze the wall time: the epoch has ended."""
        with self._lock:
            self._ended = self._ended or time.perf_counter()
        if self._mixing is not None:
            self._mixing.finished()

    def fetched(self, partitions: int, rows: int, queries: int, seconds: float) -> None:
        """``queries`` queries brought ``partitions`` partitions of ``rows`` rows, converted, in
        ``seconds`` (one fetch job: a partition, or a fetch unit)."""
        with self._lock:
            self._queries += queries
            self._fetches += partitions
            self._rows += rows
            self._fetch_seconds += seconds

    def delivered(self, samples: int, nbytes: int, waited: float, queue_depth: int) -> None:
        """One batch handed to the consumer after it waited ``waited`` seconds."""
        with self._lock:
            self._batches += 1
            self._samples += samples
            self._bytes += nbytes
            self._wait += waited
            self._depth_total += queue_depth

    def snapshot(self) -> LoaderStats:
        mixing = self._mixing.get() if self._mixing is not None and self._mixing.shuffled else None
        with self._lock:
            seconds = max((self._ended or time.perf_counter()) - self._started, 1e-9)
            return LoaderStats(
                epoch=self._epoch,
                batches=self._batches,
                samples=self._samples,
                seconds=seconds,
                samples_per_second=self._samples / seconds,
                consumer_wait_seconds=self._wait,
                starvation=min(self._wait / seconds, 1.0),
                partitions_fetched=self._fetches,
                fetch_seconds_per_partition=self._fetch_seconds / self._fetches if self._fetches else 0.0,
                mean_queue_depth=self._depth_total / self._batches if self._batches else 0.0,
                bytes_moved=self._bytes,
                queries=self._queries,
                rows_per_query=self._rows / self._queries if self._queries else 0.0,
                partitions_per_batch=mixing.partitions_per_batch if mixing else math.nan,
                rank_correlation=mixing.rank_correlation if mixing else math.nan,
            )
