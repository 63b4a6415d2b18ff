"""CPU offload on: sharded params and grads live on the host."""

from harness.spec import Scenario, Sharding, accumulate
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1"), offload=True),
    schedule=accumulate(2),
)
