"""HSDP (replicate x shard) with the replicate all-reduce deferred to the last micro-batch."""

from harness.spec import MicroBatch, Scenario, Sharding
from scenarios._hsdp_usage import GLOO_NO_AVG
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), replicate=2),
    schedule=(MicroBatch(all_reduce=False), MicroBatch()),
    world_sizes=(2, 4),
    expect=(GLOO_NO_AVG,),
)
