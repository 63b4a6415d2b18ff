"""D1: HSDP, ``extra`` used only in micro-batch 0, all-reduce deferred to micro-batch 1.

The pending flat all-reduce buffer's layout comes from micro-batch 0's grads; micro-batch 1
has fewer: "The size of tensor a (..) must match the size of tensor b (..)".
"""

import torch
from torch import nn

from harness.spec import UNUSED_PARAMS_API, Expect, Scenario, mean_square
from scenarios._hsdp_usage import DEFERRED, GLOO_NO_AVG, HSDP
from scenarios._models import randn_batch


class WithExtra(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(7, 8)
        self.extra = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        h = self.body(x)
        return self.head(self.extra(h) if use_extra else h)


SCENARIO = Scenario(
    model=WithExtra,
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x, use_extra=ctx.micro_batch == 0)),
    sharding=HSDP,
    schedule=DEFERRED,
    world_sizes=(2, 4),
    patches=("unused_param_reduction",),
    api=UNUSED_PARAMS_API,
    # the D1 error comes before the all-reduce, so it wins over GLOO_NO_AVG on torch 2.7
    expect=(Expect(status="error", torch="<2.15", match="must match the size of tensor b", fixed_by="unused_param_reduction"), GLOO_NO_AVG),
)
