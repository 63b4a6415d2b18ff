"""Shared pieces of the B scenarios (mixed gradient dtypes under accumulation)."""

import torch

from harness.spec import Sharding

BF16_FP32 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def sharding(*, api: bool) -> Sharding:
    return Sharding(reduce_scatter_unused_params=api, **BF16_FP32)
