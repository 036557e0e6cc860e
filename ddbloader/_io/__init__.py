"""I/O: the thread toolkit, fetchers of partitions and fetch units, streamed pieces, the cache."""
