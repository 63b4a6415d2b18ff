"""U: the output head's weight used outside the head's forward (a fused linear cross-entropy).

The head is its own FSDP unit. The model's forward runs it on the last position only (the
logits a generation step needs); the loss over every position multiplies the hidden states
by ``head.weight`` itself, chunk by chunk, as fused and chunked linear cross-entropy kernels
do. By then the head has resharded after its forward, so the loss meets a sharded DTensor
weight: "got mixed torch.Tensor and DTensor" on every torch. Stacks keep the head gathered
from its forward until backward and let it reshard again between steps (NVIDIA-NeMo/Automodel
#3708 shards it with ``reshard_after_forward=False``; verl changes the value at run time with
a backport of ``set_reshard_after_forward`` for torch < 2.8). The ``ReshardAfterForward`` hook
does that every step, through the public setter (``api``, torch >= 2.8) or the patches
module's ``set_reshard_after_forward``; vanilla leaves the head as ``fully_shard`` made it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from harness.spec import Expect, PublicApi, Scenario, Sharding
from harness.train.hooks import ReshardAfterForward

VOCAB, DIM, CHUNK = 16, 8, 8


class HeadLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mid = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.mid(self.emb(tokens)))
        return hidden, self.head(hidden[:, -1])


def tokens(ctx) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 6))


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logits of each chunk of positions made from the weight directly, never all at once."""
    rows, labels = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    total = sum(F.cross_entropy(F.linear(rows[i:i + CHUNK], weight).float(), labels[i:i + CHUNK], reduction="sum")
                for i in range(0, rows.shape[0], CHUNK))
    return total / rows.shape[0]


def fused_loss(model: nn.Module, batch: torch.Tensor, ctx) -> torch.Tensor:
    hidden, last = model(batch)
    return chunked_linear_cross_entropy(hidden, model.head.weight, batch.roll(-1, dims=1)) + last.float().square().mean()


SCENARIO = Scenario(
    model=HeadLM,
    batch=tokens,
    forward=fused_loss,
    sharding=Sharding(units=("head",)),
    hooks=(ReshardAfterForward("head"),),
    patches=("set_reshard_after_forward",),
    api=PublicApi(name="FSDPModule.set_reshard_after_forward", since="2.8", replaces=("set_reshard_after_forward",),
                  by_hook=True),
    expect=(
        Expect(status="error", match="got mixed torch.Tensor and DTensor", fixed_by="set_reshard_after_forward",
               why="the head resharded after its forward: the loss reads its weight as a sharded DTensor"),
    ),
)
