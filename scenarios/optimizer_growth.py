"""AdamW (foreach, and fused) over sharded params for six steps: what the rank holds must not grow per step.

A per-step leak inside the optimizer step over DTensor params (a tensor kept in a cache or
created anew each step) leaves the numbers right, so only the cell's resource rows can show
it (``harness.train.resources``: rank 0's live tensors, their bytes and, on CUDA, the allocated
memory after every step). With ``ResourceGrowth()`` among its checks a passing cell whose rows grow every step
after the first is a mismatch ("resources: ..."). Reports: pytorch/pytorch#188174 (fused
AdamW), pytorch/pytorch#178276 (foreach), both on CUDA. Measured on CPU (gloo), torch
2.13.0: flat (no growth), so the cells pass; the check stays for CUDA.
"""

from harness.spec import Optim, Scenario, Sharding
from harness.train.checks import ResourceGrowth
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2")),
    optimizer=Optim(foreach=True),
    steps=6,
    world_sizes=(2,),
    checks=(ResourceGrowth(),),
)

SCENARIOS = [SCENARIO.replace(name="optimizer_growth_fused", optimizer=Optim(fused=True),
                              summary="Fused AdamW over sharded params for six steps: what the rank holds must not grow")]
