"""The names ddbloader's derived queries give the columns they add: the keys, the row counts, a
PIVOT's values and a scheme value's position.

Shared by the query's rewrites, the planning queries and the code that reads their results, so
both sides name a column the same way.
"""

from __future__ import annotations

__all__ = [
    "GROUP_ALIAS",
    "INDEX_SUFFIX",
    "KEY_ALIASES",
    "ORDER_ALIAS",
    "PIVOT_ALIAS",
    "REPARTITION_ALIAS",
    "ROWS_ALIAS",
]

GROUP_ALIAS = "_ddb_group"
REPARTITION_ALIAS = "_ddb_repartition"
ROWS_ALIAS = "_ddb_rows"
PIVOT_ALIAS = "_ddb_pivot"
#: The prefix of the hidden columns that carry ORDER BY terms the query does not select
#: (``_ddb_order1``, ...; see :mod:`ddbloader._sql.ordering`): never in a fetched result.
ORDER_ALIAS = "_ddb_order"
#: Column of :meth:`~ddbloader._sql.query.UserQuery.key_counts` holding the position of the
#: matched scheme value.
INDEX_SUFFIX = "_index"
#: The key columns :meth:`~ddbloader._sql.rewrites.WrappedQuery.filtered_many` selects after the
#: query's own, in key order.
KEY_ALIASES = (GROUP_ALIAS, REPARTITION_ALIAS)
