"""I1: a unit frozen in the first forward and unfrozen later, bf16 params / fp32 reduce.

FSDP2 resolves a param group's reduce and original dtypes once, at lazy init (the first
forward), from the parameters that require grad then (pytorch/pytorch#154103, torch
2.8). A group with none, here ``body``, frozen through step 0, keeps ``None`` for both;
once unfrozen its grads are reduced in bf16 and not cast back, and assigning them to
the fp32 sharded parameters fails at the first backward after unfreezing:
"attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with dtype
'float'" (2.8, 2.9; "... with grad_dtype 'Float'" from 2.10), also at world size 1.
pytorch/pytorch#186998, fixed by pytorch/pytorch#187376 in 2.14 (an all-frozen group
falls back to its floating parameters' dtypes). 2.7 resolved the dtypes over every
parameter, frozen or not. Fixed before 2.14 by ``late_unfreeze_reduce_dtype``.
"""

import torch

from harness.spec import Expect, Scenario, Sharding
from scenarios._models import randn_batch
from scenarios._unfreeze import Backbone, unfreeze_from

SCENARIO = Scenario(
    model=Backbone,
    batch=randn_batch(),
    forward=unfreeze_from(),
    sharding=Sharding(units=("body",), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    patches=("late_unfreeze_reduce_dtype",),
    expect=(
        Expect(status="error", torch=">=2.8,<2.14", variants=("vanilla",), match="attempting to assign a gradient",
               fixed_by="late_unfreeze_reduce_dtype", upstream="pytorch/pytorch#186998",
               why="the all-frozen group reduces in bf16 and assigns bf16 grads to fp32 parameters"),
    ),
)
