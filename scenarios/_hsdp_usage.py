"""Shared pieces of the D scenarios (HSDP deferred all-reduce, changing param usage)."""

from harness.spec import MicroBatch, Sharding

#: micro-batch 0 keeps reduce-scatter but defers the replicate all-reduce; 1 does it.
DEFERRED = (MicroBatch(all_reduce=False), MicroBatch())
HSDP = Sharding(replicate=2)
