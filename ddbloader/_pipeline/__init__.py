"""The executor of an epoch: resident partitions, the batch gather, the device stage, prefetch."""
