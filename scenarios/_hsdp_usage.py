"""Shared pieces of the D scenarios (HSDP deferred all-reduce, changing param usage)."""

from harness.spec import Expect, MicroBatch, Sharding

#: micro-batch 0 keeps reduce-scatter but defers the replicate all-reduce; 1 does it.
DEFERRED = (MicroBatch(all_reduce=False), MicroBatch())
HSDP = Sharding(replicate=2)

#: In torch 2.7, FSDP2's HSDP all-reduce asks gloo for ReduceOp.AVG, which gloo lacks
#: there: on CPU such cells fail before they test anything, vanilla or patched.
GLOO_NO_AVG = Expect(status="error", torch="<2.8", variants=("vanilla", "patched", "api"), devices=("cpu",),
                     match="Cannot use ReduceOp.AVG with Gloo",
                     why="HSDP all-reduce uses ReduceOp.AVG, unsupported by gloo in torch 2.7")
