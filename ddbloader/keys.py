"""Sample keys (``key_col=``): the values of some columns at each sample's first y row.

A batch then carries a third element, a dict ``{name: values}``, so predictions can be joined
back to the rows they predict. The keys are read from the query's own columns (before any
transform) when a partition is converted, ride along with the partition's rows (edges and
segments included), and are gathered with the same row numbers as y
(:func:`ddbloader._pipeline.batch.gather_keys`, with the batch's other tensors). Without ``key_col`` none
of this runs: blocks carry no keys and the batch stays ``(x, y)``.

Representation, per column, decided once from the column's type (the same in every batch):
numbers and booleans become a tensor ``[B]`` of their dtype; integers or booleans with NULL
anywhere in the query, and DECIMALs, become a ``list`` of exact Python values (``int`` /
``Decimal`` / ``None``: an id above 2^53 keeps its identity); temporal columns
become an int64 tensor of their Arrow unit since the epoch (a DuckDB TIMESTAMP: microseconds,
a DATE: days); every other type (strings, symbols, blobs) becomes a ``list`` of Python values.
Keys stay on the host (they are for joining predictions back, not for the model).
"""

from ._io.key_arrays import Keys

__all__ = ["Keys"]
