"""Pure functions of (plan, seed, epoch, rank, world, worker): shuffle, shard, fetch-unit cutting."""
