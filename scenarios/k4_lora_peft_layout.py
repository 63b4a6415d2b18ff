"""K4: K1 in PEFT's module layout: a frozen bf16 ``base_layer`` and fp32 adapters held in
``lora_A``/``lora_B`` module dicts under the adapter's name (``lora_A.default.weight``).

The layout LoRA models have once PEFT wraps them, and the one stack code recognises
adapters by (axolotl's ``carve_trainable_dtype`` matches ``lora_A``/``lora_B``; K1's
``lora_a``/``lora_b`` would not be found by it). torch 2.7 counts the frozen base in the
unit's dtype check ("FSDP expects uniform original parameter dtype"); 2.8 .. 2.15 check the
trainable parameters only. ``shard_by_dtype`` shards each dtype as its own unit whatever the
adapters are called.
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding
from scenarios._dtype_mix import BF16, OVERRIDE_API
from scenarios._models import IN, randn_batch


class PeftLoraLinear(nn.Module):
    """PEFT's ``LoraLayer`` shape: ``base_layer`` (bf16, frozen), ``lora_A["default"]`` (in -> rank)
    and ``lora_B["default"]`` (rank -> out), fp32, each computed in its own dtype."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2, adapter: str = "default") -> None:
        super().__init__()
        self.adapter = adapter
        self.base_layer = nn.Linear(d_in, d_out).to(BF16).requires_grad_(False)
        self.lora_A = nn.ModuleDict({adapter: nn.Linear(d_in, rank, bias=False)})
        self.lora_B = nn.ModuleDict({adapter: nn.Linear(rank, d_out, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lora = self.lora_B[self.adapter](self.lora_A[self.adapter](x.float()))
        return self.base_layer(x.to(BF16)).float() + lora


class PeftLoraNet(nn.Module):
    """in(7) -> 13 -> 3 of ``PeftLoraLinear`` layers, tanh between."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([PeftLoraLinear(IN, 13), PeftLoraLinear(13, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](torch.tanh(self.layers[0](x)))


SCENARIO = Scenario(
    model=PeftLoraNet,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1")),
    patches=("shard_by_dtype",),
    api=OVERRIDE_API,
    expect=(Expect(status="error", torch="<2.8", match="uniform original parameter dtype", fixed_by="shard_by_dtype",
                   why="2.7 counts the frozen bf16 base in the unit's dtype check"),),
)
