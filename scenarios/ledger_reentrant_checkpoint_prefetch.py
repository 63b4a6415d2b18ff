"""Reentrant activation checkpointing with explicit forward prefetch: extra all-gathers in backward.

Four FSDP units (one per linear layer), each layer run through
``torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)``, and each unit told to
prefetch the next one in forward (``set_modules_to_forward_prefetch``). Backward should
all-gather each resharded unit once (4 per micro-batch); the reentrant recomputation runs
each layer's forward again inside backward, and its forward prefetch all-gathers the next
unit again, which backward then gathers once more (7 on torch 2.13, CPU). The grads stay
right: only the collective ledger shows it (NVIDIA-NeMo/Automodel#3411; the fix is
``use_reentrant=False``).
"""

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint

from harness.spec import Ctx, Expect, Scenario, Sharding, mean_square
from harness.train.checks import LedgerRules
from harness.train.ledger import at_most
from scenarios._models import IN, randn_batch

DIMS = (IN, 13, 11, 9, 3)
UNITS = tuple(f"layers.{i}" for i in range(len(DIMS) - 1))


class CheckpointedMLP(nn.Module):
    """in(7) -> 13 -> 11 -> 9 -> 3, every layer checkpointed (reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(DIMS, DIMS[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # checkpointing does not change the math: the reference (which takes grads with
        # torch.autograd.grad, which reentrant checkpointing refuses) runs the layers plainly
        sharded = isinstance(self.layers[0], FSDPModule)
        if sharded:
            x = x.requires_grad_()  # reentrant checkpointing passes no grad back to params without it
        for i, layer in enumerate(self.layers):
            x = checkpoint(layer, x, use_reentrant=True) if sharded else layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def forward(model: nn.Module, batch: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    layers = model.layers
    if isinstance(layers[0], FSDPModule):  # the FSDP2 side: prefetch the next unit
        for layer, following in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([following])
    return mean_square(model(batch))


SCENARIO = Scenario(
    model=CheckpointedMLP,
    batch=randn_batch(),
    forward=forward,
    sharding=Sharding(units=UNITS),
    world_sizes=(2,),
    checks=(LedgerRules(at_most("all_gather", len(UNITS), phase="backward")),),
    expect=(Expect(status="mismatch", variants=("vanilla", "deployed"), match="ledger:", upstream="NVIDIA-NeMo/Automodel#3411",
                   why="reentrant recomputation re-runs each unit's forward prefetch in backward: more all-gathers "
                       "than units (grads are right); use_reentrant=False avoids it"),),
)
