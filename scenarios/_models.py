"""Small models shared by scenarios. Dims are deliberately not divisible by 2 or 4,
so FSDP2's uneven sharding and padding are exercised."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["IN", "MLP", "Gated", "randn_batch"]

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


class Gated(nn.Module):
    """``used`` (7 -> 7) always, then each optional 7 -> 7 layer the forward names in ``use``:
    ``Gated("unused")`` has ``used`` and ``unused``; ``model(x, use=("unused",))`` runs both.
    The toy model of the unused-parameter bugs (A, B, D, E)."""

    def __init__(self, *optional: str) -> None:
        super().__init__()
        self.used = nn.Linear(IN, IN)
        self.optional = optional
        for name in optional:  # registered in this order: the init RNG draws follow it
            setattr(self, name, nn.Linear(IN, IN))

    def forward(self, x: torch.Tensor, use: tuple[str, ...] = ()) -> torch.Tensor:
        unknown = set(use) - set(self.optional)
        if unknown:
            raise ValueError(f"Gated: no optional layer {sorted(unknown)} (has {self.optional})")
        y = self.used(x)
        for name in self.optional:
            if name in use:
                y = getattr(self, name)(y)
        return y


def randn_batch(rows: int = 5, cols: int = IN):
    """A batch factory: ``rows x cols`` standard normal (the harness seeds it per rank)."""
    return lambda ctx: torch.randn(rows, cols)
