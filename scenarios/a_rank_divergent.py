"""A: ranks use different parameters in one FSDP unit (odd ranks skip ``cond``).

Vanilla FSDP2 reduce-scatters only the params with a local grad, so ranks issue
different collectives: gloo aborts on the size mismatch, NCCL hangs or corrupts data.
Fixed by reducing unused params (public API >= 2.13, else a zero-grad fill): ``cond``'s
grad is the mean over ranks with 0 from the ranks that skipped it.
"""

import torch
from torch import nn

from harness.spec import HANG, UNUSED_PARAMS_API, Expect, Scenario, mean_square
from scenarios._models import randn_batch


class CondNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cond = nn.Linear(7, 7)
        self.out = nn.Linear(7, 3)

    def forward(self, x: torch.Tensor, use_cond: bool = True) -> torch.Tensor:
        return self.out(self.cond(x) if use_cond else x)


def forward(model, batch, ctx):
    return mean_square(model(batch, use_cond=ctx.rank % 2 == 0))


SCENARIO = Scenario(
    model=CondNet,
    batch=randn_batch(),
    forward=forward,
    world_sizes=(2, 4),
    patches=("unused_param_reduction",),
    api=UNUSED_PARAMS_API,
    timeout_s=20,
    expect=(
        Expect(status="crash", devices=("cpu",), match="enforce fail", fixed_by="unused_param_reduction",
               why="gloo aborts the process: ranks reduce-scatter different sizes (measured on 2.7.1-2.15.0)"),
        Expect(status="hang|mismatch", devices=("cuda",), fixed_by="unused_param_reduction",
               match={"hang": HANG, "mismatch": "cond."}, why="NCCL hangs or corrupts data"),
    ),
)
