"""HSDP with the patched clip: the norm sums over the shard dim only, never over replicas (grads offloaded).

Vanilla torch clips HSDP grads correctly on CPU; the cell checks that the patched
``clip_grad_norm_`` does too (a norm counted once per replica would clip too hard).
"""

from harness.spec import Clip, Scenario, Sharding, accumulate
from scenarios._hsdp_usage import GLOO_NO_AVG
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), replicate=2, offload=True),
    schedule=accumulate(2),
    clip=Clip(max_norm=0.05),
    world_sizes=(2, 4),
    patches=("clip_grad_norm",),
    expect=(GLOO_NO_AVG,),
)
