"""Q: a frozen non-float parameter in an FSDP unit (the packed weights of a quantized base).

A ``uint8`` parameter with ``requires_grad=False`` beside trainable float ones, as quantized
bases keep their packed weights. Older releases make every sharded parameter require grad
first and fail on it (2.7 – 2.11, measured); 2.12 and later shard it and keep its dtype.
``patch_fsdp_nonfloat_params`` creates such parameters without grad while ``fully_shard``
runs; stacks wrap their sharding in the same kind of guard (axolotl's ``nonfloat_param_guard``).
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding, mean_square
from scenarios._models import IN, randn_batch

UPSTREAM = "pytorch/pytorch#177844"


class PackedLinear(nn.Module):
    """A linear layer whose frozen base is stored packed as uint8 codes (one scale), plus a
    trainable float correction."""

    def __init__(self, features: int) -> None:
        super().__init__()
        codes = torch.randint(0, 256, (features, features), dtype=torch.uint8)
        self.codes = nn.Parameter(codes, requires_grad=False)
        self.delta = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = (self.codes.float() - 128.0) / 512.0
        return x @ base.t() + self.delta(x)


class PackedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([PackedLinear(IN), PackedLinear(IN)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


SCENARIO = Scenario(
    model=PackedMLP,
    batch=randn_batch(),
    forward=lambda model, batch, ctx: mean_square(model(batch)),
    sharding=Sharding(units=("layers.0", "layers.1")),
    patches=("nonfloat_params",),
    expect=(
        Expect(status="error", torch="<2.12", upstream=UPSTREAM, fixed_by="nonfloat_params",
               match="only Tensors of floating point dtype can require gradients",
               why="FSDP2 makes the sharded parameter require grad before copying requires_grad=False"),
    ),
)
