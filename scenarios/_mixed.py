"""Shared pieces of the B scenarios (mixed gradient dtypes under accumulation)."""

import torch
from torch import nn

from harness.spec import Sharding

BF16_FP32 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class UsedUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(7, 7)
        self.unused = nn.Linear(7, 7)

    def forward(self, x: torch.Tensor, use_unused: bool) -> torch.Tensor:
        y = self.used(x)
        return self.unused(y) if use_unused else y


def batch(ctx):
    return torch.randn(5, 7)


def sharding(*, api: bool) -> Sharding:
    return Sharding(reduce_scatter_unused_params=api, **BF16_FP32)
