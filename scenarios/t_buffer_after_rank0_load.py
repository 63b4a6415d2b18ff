"""T: a non-persistent buffer after a meta-device build and a rank-0 checkpoint broadcast.

Stacks that cannot hold the full model on every rank build it on the meta device, shard it,
``to_empty`` it on the device and load rank 0's checkpoint with ``set_model_state_dict(...,
full_state_dict=True, broadcast_from_rank0=True)`` (``Sharding(init="rank0")``). A buffer
registered with ``persistent=False`` (rotary ``inv_freq``) is in no state dict, so nothing
writes it: it keeps what ``to_empty`` left, uninitialised memory, on every rank including
rank 0 (measured by hand on 2.7.1 and 2.13.0: denormals and zeros, different per rank). The
harness makes that memory NaN, so the loss and every grad are NaN on every torch. Persistent
buffers and parameters are broadcast correctly (``t2_persistent_buffer_rank0_load``
passes). The fix is the loader's (volcengine/verl#6365,
hiyouga/LlamaFactory#10820, EvolvingLMMs-Lab/lmms-engine#185: recompute the non-persistent
buffers or broadcast them from rank 0 after the load); torch has no call that does it.
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding, mean_square

DIM = 8


class RotaryMLP(nn.Module):
    def __init__(self, persistent: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM),
                             persistent=persistent)
        self.register_buffer("shift", torch.full((DIM,), 0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x) * self.inv_freq.repeat(2) + self.shift))


def batch(ctx) -> torch.Tensor:
    return torch.randn(4, DIM)


SCENARIO = Scenario(
    model=RotaryMLP,
    batch=batch,
    forward=lambda model, x, ctx: mean_square(model(x)),
    sharding=Sharding(units=("inp",), init="rank0"),
    expect=(
        Expect(status="mismatch", variants=("vanilla", "deployed"), match="NaN or inf on the FSDP side",
               why="the non-persistent buffer is in no checkpoint: it keeps to_empty's memory (NaN here)"),
    ),
)
