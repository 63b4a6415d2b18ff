"""bf16 params with ``reduce_dtype=None``: which dtype FSDP2 reduce-scatters the grads in.

``MixedPrecisionPolicy(param_dtype=bfloat16)`` without a ``reduce_dtype``: through torch
2.14 the grads are reduce-scattered in bf16 (the param dtype); torch 2.15 changed what
``reduce_dtype=None`` means and reduces in fp32. The values pass either way; the collective
ledger (and the report's "Collective changes between torch versions") shows the change.
"""

import torch

from harness.spec import Scenario, Sharding
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1"), param_dtype=torch.bfloat16),
    world_sizes=(2,),
)
