"""I2: bf16 master weights, a unit frozen in the first forward then unfrozen: silently reduced in bf16.

Parameters stored in bf16 with ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` (compute in the storage dtype, reduce in fp32). As in I1, torch 2.8
.. 2.13 leave the reduce dtype of ``body``'s param group ``None`` after a first forward
with ``body`` frozen (pytorch/pytorch#186998, from pytorch/pytorch#154103). Here nothing
raises: the grads and the parameters are both bf16, so the reduction silently runs in
bf16 instead of fp32 and the grads keep their dtype (bf16 either way). Only the values
tell: the ranks' losses are weighted (2**9, 1, -2**9, 1) on identical data, so the
large grads cancel and their fp32 mean (half of rank 1's grad, exact in bf16) is lost
by a bf16 sum in any order. With one or two ranks a bf16 sum rounds once, like the fp32 mean cast to bf16, so
the bug cannot show there: the scenario runs at world size 4 only. Fixed in 2.14
(pytorch/pytorch#187376); before, by ``late_unfreeze_reduce_dtype``.

Without a ``MixedPrecisionPolicy`` bf16 parameters reduce in bf16 by design and the
unresolved dtypes change nothing. After no-sync micro-batches the same bug is loud
(``i3_unfreeze_bf16_master_accumulate``).
"""

import torch

from harness.spec import Ctx, Expect, Scenario, Sharding, differs_only, mean_square
from scenarios._unfreeze import UNFREEZE_STEP, Backbone

#: Per-rank loss weights: powers of two and -1, so each rank's grad is an exact multiple of
#: the same grad; the two large ones cancel and a bf16 sum drops the small ones.
RANK_WEIGHTS = (2.0**9, 1.0, -(2.0**9), 1.0)


def batch(ctx: Ctx) -> torch.Tensor:
    """The same rows on every rank (seeded by step only)."""
    return torch.randn(5, 7, generator=torch.Generator().manual_seed(1000 + ctx.step))


def forward(model, x, ctx):
    if ctx.step >= UNFREEZE_STEP:
        model.body.requires_grad_(True)
    return mean_square(model(x)) * RANK_WEIGHTS[ctx.rank % len(RANK_WEIGHTS)]


SCENARIO = Scenario(
    model=lambda: Backbone(torch.bfloat16),
    batch=batch,
    forward=forward,
    sharding=Sharding(units=("body",), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    world_sizes=(4,),
    patches=("late_unfreeze_reduce_dtype",),
    expect=(
        Expect(status="mismatch", torch=">=2.8,<2.14", variants=("vanilla",), fixed_by="late_unfreeze_reduce_dtype",
               upstream="pytorch/pytorch#186998", symptom=differs_only("body.*"),
               why="body's grads are reduced in bf16, not fp32: the small ranks' contributions are lost"),
    ),
)
