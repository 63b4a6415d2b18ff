"""E across steps: ``sometimes`` is used in step 1 only, and ``zero_grad(set_to_none=False)`` runs after it.

With unused-param reduction on, steps 0 and 2 zero-fill ``sometimes``. In step 0 it never
had a grad, so E's patch must give it back None (no weight decay, no optimizer state);
in step 2 it still holds the zeros that ``zero_grad(set_to_none=False)`` left, which
plain autograd keeps too (AdamW steps it), so the patch must leave that grad alone.
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding, accumulate, mean_square


class Sometimes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(7, 7)
        self.sometimes = nn.Linear(7, 7)

    def forward(self, x: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        y = self.used(x)
        return self.sometimes(y) if use_sometimes else y


SCENARIO = Scenario(
    model=Sometimes,
    batch=lambda ctx: torch.randn(5, 7),
    forward=lambda model, x, ctx: mean_square(model(x, use_sometimes=ctx.step == 1)),
    sharding=Sharding(reduce_scatter_unused_params=True),
    schedule=accumulate(2),
    steps=3,
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    expect=(Expect(status="mismatch", torch=">=2.13", match="reference None", fixed_by="restore_unused_param_grads"),),
)
