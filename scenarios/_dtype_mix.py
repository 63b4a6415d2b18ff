"""Models whose parameters have two dtypes under one FSDP unit (bug K), and the recipe of
the 2.15 public API that covers them (``MixedPrecisionPolicy.param_dtype_override_fn``).

Each model computes every parameter in its own dtype (the forward casts), so the
reference runs it as declared. The API variant keeps that compute and changes storage
only: bf16 parameters are stored in fp32 (lossless) so one unit holds one dtype, and
``param_dtype=bf16`` with an override that keeps the originally fp32 parameters in fp32
all-gathers each parameter in the dtype the model computes it in.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.spec import PublicApi
from scenarios._models import IN

__all__ = ["BF16", "LoraLinear", "LoraNet", "OVERRIDE_API", "RoutedExperts"]

BF16 = torch.bfloat16
#: set on the parameters that kept fp32 storage in the model as declared
_KEEPS = "_keeps_fp32_compute"


class LoraLinear(nn.Module):
    """A bf16 ``base`` Linear (frozen unless ``train_base``) plus fp32 LoRA adapters
    ``lora_a`` (in -> rank) and ``lora_b`` (rank -> out), each computed in its own dtype."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2, train_base: bool = False) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out).to(BF16).requires_grad_(train_base)
        self.lora_a = nn.Linear(d_in, rank, bias=False)
        self.lora_b = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x.to(BF16)).float() + self.lora_b(self.lora_a(x.float()))


class LoraNet(nn.Module):
    """in(7) -> 13 -> 3 of ``LoraLinear`` layers, tanh between."""

    def __init__(self, train_base: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([LoraLinear(IN, 13, train_base=train_base), LoraLinear(13, 3, train_base=train_base)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](torch.tanh(self.layers[0](x)))


class RoutedExperts(nn.Module):
    """A mixture of two bf16 experts (7 -> 5) weighted by an fp32 router (7 -> 2, kept in
    fp32 as MoE stacks keep routers), both under ``moe``, then a bf16 ``out`` (5 -> 3);
    every parameter trainable."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = nn.Module()
        self.moe.router = nn.Linear(IN, 2)
        self.moe.experts = nn.ModuleList(nn.Linear(IN, 5).to(BF16) for _ in range(2))
        self.out = nn.Linear(5, 3).to(BF16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.moe.router(x.float()), dim=-1)
        xb = x.to(BF16)
        mixed = sum(weights[:, i:i + 1] * expert(xb).float() for i, expert in enumerate(self.moe.experts))
        return self.out(mixed.to(BF16)).float()


def _store_fp32(model: nn.Module) -> None:
    """Store every bf16 parameter in fp32 (exact); mark the ones that were fp32 already."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == BF16:
                p.data = p.data.float()
            else:
                setattr(p, _KEEPS, True)


def _keep_fp32(param: nn.Parameter) -> torch.dtype | None:
    return param.dtype if getattr(param, _KEEPS, False) else None


#: The 2.15 API route: one storage dtype, each parameter all-gathered in its model dtype,
#: inputs not cast (the model casts them itself).
OVERRIDE_API = PublicApi(
    name="MixedPrecisionPolicy.param_dtype_override_fn", since="2.15", replaces=("shard_by_dtype",),
    sharding={"prepare": _store_fp32,
              "mp_fields": {"param_dtype": BF16, "cast_forward_inputs": False, "param_dtype_override_fn": _keep_fp32}},
)
