"""WindowRows: where a combed piece of windows lies in its series (see
:mod:`ddbloader._sql.window_pieces`), and the arithmetic the schedule and the pool do with it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["WindowRows"]


@dataclass(frozen=True)
class WindowRows:
    """Where a combed windowed piece's rows lie in its series, rows numbered in the query's order.

    ``runs``: ``(first row, rows)`` of each run of consecutive series rows the piece's query
    returns, ascending; the piece's block is the runs one after another. ``starts``: the
    ``[first, stop)`` series rows where the piece's windows start (its stripes), ascending, each
    inside one run with at least ``span - 1`` rows of that run after it unless the series ends.
    Invariants (checked by the tests without an engine): runs disjoint and not adjacent; the
    stripes of a series' pieces cover its rows exactly once.
    """

    runs: tuple[tuple[int, int], ...]
    starts: tuple[tuple[int, int], ...]
    #: the loader's window stride: sample ``i`` starts at series row ``i * stride``
    stride: int

    def samples(self, first: int, stop: int) -> np.ndarray[Any, Any]:
        """The samples among ``[first, stop)`` that start in this piece, ascending int64."""
        stride = self.stride
        found = [
            np.arange(max(-(-low // stride), first), min(-(-high // stride), stop), dtype=np.int64)
            for low, high in self.starts
        ]
        if not found:
            return np.empty(0, np.int64)
        samples: np.ndarray[Any, Any] = np.concatenate(found)
        return samples

    def block_rows(self, series_rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The rows of the piece's block holding ``series_rows`` (each in some run)."""
        run = np.searchsorted(self._run_firsts, series_rows, side="right") - 1
        shifted: np.ndarray[Any, Any] = series_rows + self._shifts[run]
        return shifted

    @property
    def stripe_rows(self) -> int:
        """The rows whose windows this piece serves (its stripes)."""
        return sum(high - low for low, high in self.starts)

    @functools.cached_property
    def _run_firsts(self) -> np.ndarray[Any, Any]:
        return np.array([first for first, _ in self.runs], np.int64)

    @functools.cached_property
    def _shifts(self) -> np.ndarray[Any, Any]:
        """Per run: block row minus series row."""
        before = np.cumsum([0] + [rows for _, rows in self.runs[:-1]], dtype=np.int64)
        shifts: np.ndarray[Any, Any] = before - self._run_firsts
        return shifts
