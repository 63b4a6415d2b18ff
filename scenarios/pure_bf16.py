"""Pure bf16 training: parameters stored in bf16, no MixedPrecisionPolicy, clipping and grad scaling.

Users who keep parameters in bf16 (no fp32 master copy) compute, reduce and step in
bf16: FSDP2 reduce-scatters the bf16 grads as they are. The recipe scales the grads
(``scale_grads``, grad scale 1/3: not a power of two, so it rounds) and clips them by
their infinity norm (``clip_grad_norm``) before an AdamW step in bf16; the deployed set
runs every patch of ``fsdp_patches`` on these dtypes. The reference computes each rank's
grads in bf16 and averages them in fp32.

Judged where the reference is exact: with one or two ranks a bf16 reduction rounds once,
like the reference's fp32 mean cast to bf16; the infinity norm is the largest grad
element, so torch's and the patch's norms and clip coefficients agree to the bit. Not
judged here: four ranks (gloo sums bf16 shards in ring order, rounding at every step,
which the reference does not replay), the 2-norm (a bf16 result that torch rounds per
parameter before combining; it can differ from a correctly rounded norm by one bf16
ulp, and the recipe compares norms as fp32 scalars) and accumulation over no-sync
micro-batches (each rank sums its micro-batches in bf16 before the reduction, the
reference sums the bf16 means after it).
"""

import math

import torch

from harness.spec import Clip, Optim, Scenario, Sharding, mean_square
from scenarios._models import MLP, randn_batch

__all__ = ["SCENARIO", "pure_low_precision"]


def pure_low_precision(dtype: torch.dtype, optimizer: Optim | None = None) -> Scenario:
    """The recipe with every parameter stored in ``dtype`` and no mixed precision."""

    def forward(model, x, ctx):
        return mean_square(model(x.to(dtype)))

    return Scenario(
        model=lambda: MLP().to(dtype),
        batch=randn_batch(),
        forward=forward,
        sharding=Sharding(units=("layers.0", "layers.1", "layers.2")),
        grad_scale=1 / 3,
        clip=Clip(max_norm=0.01, norm_type=math.inf),  # below every step's norm: clipping acts
        optimizer=optimizer or Optim(),
        world_sizes=(1, 2),
        patches=("clip_grad_norm", "scale_grads"),
        bug_devices=(),  # no bug of its own: the utilities are exercised on this dtype, not credited with a fix
    )


SCENARIO = pure_low_precision(torch.bfloat16)
