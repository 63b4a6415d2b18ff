"""CPU offload on: sharded params and grads live on the host."""

from harness.spec import Scenario, Sharding, accumulate
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    name="cpu_offload",
    summary="CPUOffloadPolicy, per-layer units, 2 micro-batches",
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1"), offload=True),
    schedule=accumulate(2),
    world_sizes=(1, 2, 4),
)
