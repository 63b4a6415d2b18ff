"""Plain FSDP2 parity: per-layer units plus root, fp32, gradient clipping."""

from harness.spec import Clip, Scenario, Sharding
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2")),
    clip=Clip(max_norm=0.05),
)
