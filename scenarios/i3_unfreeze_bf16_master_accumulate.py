"""I3: bf16 master weights, a unit unfrozen after its first forward, two micro-batches: fp32 grad on a bf16 parameter.

I2's setup (bf16 parameters, ``param_dtype=bf16``, ``reduce_dtype=fp32``, ``body`` frozen
through step 0) with gradient accumulation. The no-sync micro-batch keeps ``body``'s
unsharded grad in fp32 (its per-parameter ``reduce_dtype``), so on torch 2.8 .. 2.13,
whose ``body`` param group kept no original dtype, the fp32 reduced grad is not cast
back and its assignment to the bf16 parameter fails: "attempting to assign a gradient
with dtype 'float' to a tensor with dtype 'c10::BFloat16'" (grad_dtype from 2.10), also at
world size 1. pytorch/pytorch#186998, fixed in 2.14 by pytorch/pytorch#187376; before,
by ``late_unfreeze_reduce_dtype``.

Every rank gets the same rows: FSDP2 sums a rank's micro-batches in fp32 before the
reduction, the reference averages each micro-batch over ranks first and sums the
bf16 results; on identical data both round once, so the grads compare exactly.
"""

import torch

from harness.spec import Ctx, Expect, Scenario, Sharding, accumulate
from scenarios._unfreeze import Backbone, unfreeze_from


def batch(ctx: Ctx) -> torch.Tensor:
    """The same rows on every rank (seeded by step and micro-batch only)."""
    return torch.randn(5, 7, generator=torch.Generator().manual_seed(2000 + 10 * ctx.step + ctx.micro_batch))


SCENARIO = Scenario(
    model=lambda: Backbone(torch.bfloat16),
    batch=batch,
    forward=unfreeze_from(),
    sharding=Sharding(units=("body",), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(2),
    world_sizes=(1, 2),
    patches=("late_unfreeze_reduce_dtype",),
    expect=(
        Expect(status="error", torch=">=2.8,<2.14", variants=("vanilla",), match="attempting to assign a gradient",
               fixed_by="late_unfreeze_reduce_dtype", upstream="pytorch/pytorch#186998",
               why="the fp32 accumulated grad is reduced in fp32 and not cast back to the bf16 parameter"),
    ),
)
