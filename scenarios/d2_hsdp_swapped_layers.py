"""D2: HSDP, same-shape layers ``a`` (micro-batch 0 only) and ``b`` (micro-batch 1 only).

The flat pending buffer from micro-batch 0 (holding ``a``) is added to micro-batch 1's
(holding ``b``) with the same size: no error, ``a.grad`` is None and ``b.grad`` wrong.
Silent corruption: only the reference comparison catches it.
"""

import torch
from torch import nn

from harness.spec import UNUSED_PARAMS_API, Expect, Scenario, mean_square
from scenarios._hsdp_usage import DEFERRED, GLOO_NO_AVG, HSDP
from scenarios._models import randn_batch


class Swapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(7, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, micro_batch: int) -> torch.Tensor:
        h = self.body(x)
        return self.head(self.a(h) if micro_batch == 0 else self.b(h))


SCENARIO = Scenario(
    model=Swapped,
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x, ctx.micro_batch)),
    sharding=HSDP,
    schedule=DEFERRED,
    world_sizes=(2, 4),
    patches=("unused_param_reduction",),
    api=UNUSED_PARAMS_API,
    expect=(GLOO_NO_AVG, Expect(status="mismatch", torch="<2.15", match="presence", fixed_by="unused_param_reduction"),),
)
