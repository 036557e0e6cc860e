"""Throughput figures of an epoch: what the consumer waited for, what the fetches cost.

:class:`StatsRecorder` is written by the fetch threads and the consumer (thread-safe) and read
as an immutable :class:`LoaderStats` snapshot, which prints as text and renders as HTML.
"""

from __future__ import annotations

import html
import threading
import time
from dataclasses import dataclass, fields

__all__ = ["LoaderStats", "StatsRecorder"]


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of one epoch's throughput.

    ``starvation`` is the share of the epoch's wall time the consumer spent waiting for a batch:
    near 0 means the model is the bottleneck, near 1 means the loader is.
    """

    epoch: int
    batches: int
    windows: int
    seconds: float
    windows_per_second: float
    consumer_wait_seconds: float
    starvation: float
    partitions_fetched: int
    fetch_seconds_per_partition: float
    mean_queue_depth: float
    bytes_moved: int

    def rows(self) -> list[tuple[str, str]]:
        """(label, formatted value) pairs, in display order."""
        return [
            ("epoch", str(self.epoch)),
            ("batches", f"{self.batches:,}"),
            ("windows", f"{self.windows:,}"),
            ("wall time", f"{self.seconds:.2f} s"),
            ("windows/s", f"{self.windows_per_second:,.0f}"),
            ("consumer waited", f"{self.consumer_wait_seconds:.2f} s ({self.starvation:.0%} starvation)"),
            ("partitions fetched", f"{self.partitions_fetched:,}"),
            ("fetch time / partition", f"{self.fetch_seconds_per_partition * 1000:.1f} ms"),
            ("mean queue depth", f"{self.mean_queue_depth:.2f}"),
            ("bytes moved", f"{self.bytes_moved / 1e6:,.1f} MB"),
        ]

    def __str__(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"{label:<{width}}  {value}" for label, value in self.rows())

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><th style='text-align:left'>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
            for label, value in self.rows()
        )
        return f"<table><caption>ddbloader stats</caption>{cells}</table>"

    def as_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StatsRecorder:
    """Accumulates one epoch's figures. Thread-safe."""

    def __init__(self, epoch: int) -> None:
        self._lock = threading.Lock()
        self._epoch = epoch
        self._started = time.perf_counter()
        self._batches = 0
        self._windows = 0
        self._wait = 0.0
        self._fetches = 0
        self._fetch_seconds = 0.0
        self._depth_total = 0
        self._bytes = 0
        self._ended: float | None = None

    def finish(self) -> None:
        """Freeze the wall time: the epoch has ended."""
        with self._lock:
            self._ended = self._ended or time.perf_counter()

    def fetched(self, seconds: float) -> None:
        """One partition fetched and converted in ``seconds``."""
        with self._lock:
            self._fetches += 1
            self._fetch_seconds += seconds

    def delivered(self, windows: int, nbytes: int, waited: float, queue_depth: int) -> None:
        """One batch handed to the consumer after it waited ``waited`` seconds."""
        with self._lock:
            self._batches += 1
            self._windows += windows
            self._bytes += nbytes
            self._wait += waited
            self._depth_total += queue_depth

    def snapshot(self) -> LoaderStats:
        with self._lock:
            seconds = max((self._ended or time.perf_counter()) - self._started, 1e-9)
            return LoaderStats(
                epoch=self._epoch,
                batches=self._batches,
                windows=self._windows,
                seconds=seconds,
                windows_per_second=self._windows / seconds,
                consumer_wait_seconds=self._wait,
                starvation=min(self._wait / seconds, 1.0),
                partitions_fetched=self._fetches,
                fetch_seconds_per_partition=self._fetch_seconds / self._fetches if self._fetches else 0.0,
                mean_queue_depth=self._depth_total / self._batches if self._batches else 0.0,
                bytes_moved=self._bytes,
            )
