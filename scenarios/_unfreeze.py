"""Shared pieces of the I scenarios: a unit frozen in the first forward, unfrozen later.

``Backbone`` is ``body`` (7 -> 11, its own FSDP unit in the I scenarios) and ``head``
(11 -> 3). ``body`` is frozen at construction; ``unfreeze_from(step)`` is a scenario
forward that turns its ``requires_grad`` back on from that step (before the root's
pre-forward, so FSDP2 all-gathers it as trainable), the way fine-tuning recipes unfreeze
a backbone after a warm-up. Before that step ``body`` runs forward frozen: its FSDP2
param group resolves its mixed-precision dtypes at lazy init (the first forward) with
no trainable parameter in it (bug I).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from harness.spec import Ctx, mean_square
from scenarios._models import IN

__all__ = ["Backbone", "UNFREEZE_STEP", "unfreeze_from"]

#: The step from which ``body`` trains (step 0 runs it frozen, lazy init included).
UNFREEZE_STEP = 1


class Backbone(nn.Module):
    """``body`` (7 -> 11, frozen at construction, tanh) then ``head`` (11 -> 3);
    ``dtype`` is the storage dtype of every parameter (bf16 master weights)."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.body = nn.Linear(IN, 11)
        self.head = nn.Linear(11, 3)
        self.to(dtype)
        self.body.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x.to(self.head.weight.dtype))))


def unfreeze_from(step: int = UNFREEZE_STEP) -> Callable[[nn.Module, torch.Tensor, Ctx], torch.Tensor]:
    """A scenario forward: ``body`` trainable from ``step`` on, then ``mean_square``."""

    def forward(model: nn.Module, x: torch.Tensor, ctx: Ctx) -> torch.Tensor:
        if ctx.step >= step:
            model.body.requires_grad_(True)
        return mean_square(model(x))

    return forward
