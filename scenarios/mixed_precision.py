"""bf16 params, fp32 reduce, gradient accumulation over three micro-batches."""

import torch

from harness.spec import Scenario, Sharding, accumulate
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1"), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(3),
)
