"""Partition transforms: derived columns, computed in the fetch threads when a partition is pulled.

``DDBDataLoader(..., transform=f)`` calls ``f`` on every partition right after it is fetched, in
the fetch thread, so it overlaps training; nothing runs until a partition is pulled (CCV's
pull-model dataframe ``map``). A transform

* receives the partition as an Arrow table of the query's columns, or, wrapped in
  :func:`tensors`, as a dict of column name → tensor ``[rows, ...]`` (non-numeric columns as
  lists of Python values);
* returns an Arrow table or a dict of tensors / numpy arrays with the same number of rows: the
  plan counted every partition's rows, so a transform that adds or drops rows would break
  ``len()`` and exactly-once coverage, and is refused (filter rows in the SQL instead);
* may add, replace or drop columns: ``input_col``, ``target_col`` and ``exclude_col`` name its
  output. A column may hold a fixed-shape tensor per row (a one-hot vector, an image).

``transform=[f, g, ...]`` runs the steps in order, converting between the two forms as each step
asks. :func:`one_hot`, :func:`standardize` and :func:`cast` accept either form.

Invariants and consequences:

* **Partition-local.** A transform sees one partition (one group in one repartition) at a time.
  A derived column that looks at neighbouring rows (a lag, a log-return, a rolling mean) is
  computed per partition: the first rows of every partition have no predecessor there. Windows
  still continue across repartitions, over the transformed rows. A lag that must cross
  repartition boundaries belongs in the SQL (``SELECT *, x - LAG(x) OVER (PARTITION BY g ORDER
  BY t) AS dx FROM ...``): the loader filters the query's result, so the window function sees
  whole series.
* **Pure.** The batches stay a pure function of (plan, seed, epoch) only if every transform is a
  pure function of its partition: several fetch threads run it concurrently, in any order.
  Random augmentations draw from torch's global generator, which the training thread shares:
  batch order and coverage stay deterministic, the drawn values do not.
* **Planned.** Planning probes the transform on the query's empty result (or on a few rows of
  the smallest partition, if it fails on none) to learn the output's columns, dtypes and per-row
  shapes; every partition must then give the same.
* **Picklable** when its steps are (module-level functions and these helpers; not lambdas), so
  the loader still travels to DataLoader worker processes.

Errors: a failing step raises its own exception with a note naming the step; the fetch thread
adds the partition (its group, repartition, subquery and parameters).
"""

from __future__ import annotations

from .pipeline import Columns, Frame, Pipeline, as_pipeline, columns_to_table, table_to_tensors, tensors
from .steps import Cast, OneHot, Standardize, Stats, cast, column_stats, one_hot, standardize

__all__ = [
    "Cast",
    "Columns",
    "Frame",
    "OneHot",
    "Pipeline",
    "Standardize",
    "Stats",
    "as_pipeline",
    "cast",
    "column_stats",
    "columns_to_table",
    "one_hot",
    "standardize",
    "table_to_tensors",
    "tensors",
]
