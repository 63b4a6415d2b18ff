"""P: a tied parameter sharded in two FSDP groups (embedding tied to the output head).

``fully_shard(emb)`` and then the root, whose ``head`` shares ``emb.weight``. Older releases
break the tie without a word: the root skips the parameter another group manages, the head
keeps the unsharded original, and the tied weight's grad lacks the head's part (every row of
the vocabulary drifts from the single-process run): 2.7 – 2.11, measured. 2.12 and later
refuse it. Stacks shard the tied modules as one group (``fully_shard([emb, head])``):
``p_tied_param_one_group``.
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding, differs_only, mean_square

VOCAB, DIM = 16, 8
UPSTREAM = "pytorch/pytorch#176076"


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mid = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(tokens))))


def tokens(ctx) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 6))


SCENARIO = Scenario(
    model=TiedLM,
    batch=tokens,
    forward=lambda model, batch, ctx: mean_square(model(batch)),
    sharding=Sharding(units=("emb",)),
    steps=1,
    expect=(
        Expect(status="mismatch", torch="<2.12", variants=("vanilla", "deployed"), symptom=differs_only("emb.weight"),
               upstream=UPSTREAM, why="the tie is broken: the tied weight's grad lacks the head's part"),
        Expect(status="error", torch=">=2.12", variants=("vanilla", "deployed"), upstream=UPSTREAM,
               match="is shared with a parameter already managed by another FSDP group",
               why="refused with a ValueError that names fully_shard([module_a, module_b])"),
    ),
)
