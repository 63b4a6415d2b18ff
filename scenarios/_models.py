"""Small models shared by scenarios. Dims are deliberately not divisible by 2 or 4,
so FSDP2's uneven sharding and padding are exercised."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["IN", "MLP", "randn_batch"]

IN = 7  # input features: odd on purpose


class MLP(nn.Module):
    """in(7) -> 13 -> 11 -> 3, with biases."""

    def __init__(self, dims: tuple[int, ...] = (IN, 13, 11, 3)) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def randn_batch(rows: int = 5, cols: int = IN):
    """A batch factory: ``rows x cols`` standard normal (the harness seeds it per rank)."""
    return lambda ctx: torch.randn(rows, cols)
