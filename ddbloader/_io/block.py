"""Block: one partition's rows as row-major x and y arrays (and its key columns), read-only.

Every later window is a strided view of a block: the conversion (:mod:`ddbloader._io.convert`)
writes each value once, and nothing after it copies a row except to compact or gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .key_arrays import KeyArrays

__all__ = ["Block"]


# Not frozen: a frozen dataclass's __init__ costs 0.6 µs more, and a block is made per partition
# and per view (thousands an epoch with small groups); read-only by contract instead.
@dataclass(slots=True, eq=False)
class Block:
    """One partition as row-major arrays: x ``[rows, Fx]`` and y ``[rows, Fy]``. Read-only.

    A :meth:`view` remembers the block it was cut from (``origin``, never itself a view) and
    where (``offset``): its rows are ``origin``'s rows ``[offset, offset + rows)``, so that rows of
    several views of one fetch unit's conversion can be gathered in one take.
    """

    x: np.ndarray[Any, Any]
    y: np.ndarray[Any, Any]
    keys: KeyArrays | None = None
    origin: Block | None = field(default=None, repr=False, compare=False)
    offset: int = 0

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])

    def view(self, start: int, stop: int) -> Block:
        """Rows ``[start, stop)``, sharing this block's memory."""
        keys = None if self.keys is None else {n: v[start:stop] for n, v in self.keys.items()}
        origin = self if self.origin is None else self.origin
        return Block(self.x[start:stop], self.y[start:stop], keys, origin, self.offset + start)

    def rows_between(self, start: int, stop: int) -> Block:
        """Rows ``[start, stop)`` as a compact copy, so the full block can be freed."""
        keys = None if self.keys is None else {n: v[start:stop].copy() for n, v in self.keys.items()}
        return Block(self.x[start:stop].copy(), self.y[start:stop].copy(), keys)

    def empty_like(self, rows: int) -> Block:
        """``rows`` uninitialised rows shaped like this block's (address space until written)."""
        return self._allocated(rows, np.empty)

    def same_layout(self, other: Block) -> bool:
        """Whether ``other``'s rows can be written into this block's (same dtypes and key columns)."""
        if self.x.dtype != other.x.dtype or self.y.dtype != other.y.dtype:
            return False
        if self.keys is None or other.keys is None:
            return self.keys is None and other.keys is None
        return self.keys.keys() == other.keys.keys() and all(
            self.keys[n].dtype == other.keys[n].dtype for n in self.keys
        )

    def write(self, at: int, rows: Block) -> None:
        """Copy ``rows`` into rows ``[at, at + rows.rows)`` (of an arena's block; see :meth:`same_layout`)."""
        stop = at + rows.rows
        self.x[at:stop] = rows.x
        self.y[at:stop] = rows.y
        if self.keys is not None and rows.keys is not None:
            for name, values in rows.keys.items():
                self.keys[name][at:stop] = values

    def zeros(self, rows: int) -> Block:
        """``rows`` rows of zeros shaped like this block's (placeholders no sample reads)."""
        return self._allocated(rows, np.zeros)

    def _allocated(self, rows: int, allocate: Callable[..., np.ndarray[Any, Any]]) -> Block:
        keys = None if self.keys is None else {n: allocate(rows, v.dtype) for n, v in self.keys.items()}
        return Block(
            allocate((rows, self.x.shape[1]), self.x.dtype),
            allocate((rows, self.y.shape[1]), self.y.dtype),
            keys=keys,
        )

    @staticmethod
    def concatenate(blocks: Sequence[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        keys = blocks[0].keys
        if keys is not None:
            with_keys = [b.keys for b in blocks if b.keys is not None]
            if len(with_keys) != len(blocks):  # the keys would shift against their rows
                raise RuntimeError("internal error: concatenating blocks with and without keys")
            keys = {n: np.concatenate([k[n] for k in with_keys]) for n in keys}
        return Block(np.concatenate([b.x for b in blocks]), np.concatenate([b.y for b in blocks]), keys=keys)
