"""The SQL layer: the user's query, the plan of partitions, and the column layout."""
