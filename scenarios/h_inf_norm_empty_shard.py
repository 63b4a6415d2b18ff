"""H: inf-norm clipping when a parameter has fewer rows than ranks (an empty local shard).

``head.weight`` has shape (1, 16): on 2+ ranks some rank holds an empty shard, whose
inf norm raises only there; the others wait in the collective.
"""

import torch
from torch import nn

from harness.spec import Clip, Expect, Scenario
from scenarios._models import randn_batch


class NarrowHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(7, 16)
        self.head = nn.Linear(16, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


SCENARIO = Scenario(
    model=NarrowHead,
    batch=randn_batch(),
    clip=Clip(max_norm=0.05, norm_type=float("inf")),
    world_sizes=(2, 4),
    patches=("clip_grad_norm",),
    timeout_s=20,
    expect=(Expect(status="error", match="cannot compute the inf", fixed_by="clip_grad_norm",
                   why="the rank with the empty shard raises; its error is blamed, not the others' wait"),),
)
