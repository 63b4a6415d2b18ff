"""O: a MoE stack that reduces grads after the accumulation window, not in its last backward.

How many micro-batches a window has can depend on the data (tokens routed to experts, a
pipeline schedule's actions), so MoE and pipeline stacks run every backward with gradient
sync off and reduce once the window is over. Before torch 2.15 FSDP2 has no public call
for that: turning sync back on reduces nothing already accumulated, and the sharded grads
stay ``None`` (the vanilla cells). Stacks drive FSDP2's private post-backward themselves
(torch's own pipeline stage does, for its FSDP submodule; NeMo Automodel patches its MoE
backward: ``MoEFSDPSyncMixin``); ``finalize_backward`` (``fsdp_patches.finalize``) is that
on torch 2.7 .. 2.15. Torch 2.15 added the public ``FSDPModule.set_manual_backward_finalization
(True)`` before forward and ``finalize_backward()`` after the window (the ``api`` variant).
On 2.15 the private callback the patch drives asserts that this mode was chosen, so the
patch sets it (to off) where nothing did; measured on 2.7 .. 2.15 CPU: vanilla mismatch
(grads ``None``), patched and deployed pass everywhere, the ``api`` variant passes on 2.15.

The model: three experts, each its own FSDP unit as MoE stacks shard them, top-1 routing
with a learnt gate; every expert gets tokens in every micro-batch, so no rank skips a
unit's reduce-scatter (that is bug A).
"""

import torch
from torch import nn

from harness.spec import Expect, PublicApi, Scenario, Sharding, accumulate, presence_lost
from harness.train.hooks import ReduceAfterWindow
from scenarios._models import IN, randn_batch

EXPERTS = 3


class TinyMoE(nn.Module):
    """in(7) -> 9, a 9 -> 9 expert per token chosen by its position, weighted by the router's
    softmax for that expert, -> 3."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, 9)
        self.router = nn.Linear(9, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Linear(9, 9) for _ in range(EXPERTS))
        self.out = nn.Linear(9, 3)

    def forward(self, x: torch.Tensor, shift: int = 0) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        gate = torch.softmax(self.router(h), dim=-1)
        choice = (torch.arange(h.shape[0], device=h.device) + shift) % EXPERTS  # every expert gets a token
        mixed = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().flatten()
            mixed = mixed.index_add(0, rows, expert(h[rows]) * gate[rows, e:e + 1])
        return self.out(h + mixed)


def routed(model, batch, ctx):
    return model(batch, shift=ctx.rank + ctx.micro_batch).float().square().mean()


def _finalize(root) -> None:
    root.set_requires_gradient_sync(True)
    root.finalize_backward()


SCENARIO = Scenario(
    model=TinyMoE,
    batch=randn_batch(),
    forward=routed,
    sharding=Sharding(units=tuple(f"experts.{e}" for e in range(EXPERTS))),
    schedule=accumulate(2, last_sync=False),
    hooks=(ReduceAfterWindow(),),
    patches=("finalize_backward",),
    api=PublicApi(name="FSDPModule.set_manual_backward_finalization", since="2.15", replaces=("finalize_backward",),
                  needs=("FSDPModule.finalize_backward",),
                  configure_root=lambda root, dp_world: root.set_manual_backward_finalization(True),
                  finalize=_finalize),
    expect=(Expect(status="mismatch", variants=("vanilla",), fixed_by="finalize_backward", symptom=presence_lost("*"),
                   why="no public call reduces grads accumulated with sync off before 2.15: the sharded grads "
                       "stay None and AdamW never steps"),),
)
