"""R: a DTensor sliced over its whole extent dispatches ``aten.alias``, which 2.9 cannot shard.

A head weight distributed over the tensor-parallel dim (``Shard(1)``, columns split) and kept
by ``fully_shard`` over "dp": in forward the head takes ``weight[:, :n]`` of its full width n, as
HF models take ``hidden[:, -logits_to_keep:]`` with every position kept. The slice returns an
alias; 2.9.0 and 2.9.1 have no sharding strategy for ``aten.alias.default`` and raise
(pytorch/pytorch#170427, fixed by pytorch/pytorch#166867 in 2.10; measured: 2.7, 2.8, 2.10 ..
2.15 pass, 2.9.1 fails). Stacks register a strategy themselves (NeMo Automodel's
``apply_torch_patches``, only where ``torch.__version__`` is 2.9.0).
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding
from scenarios._models import IN, randn_batch

WIDTH, OUT = 8, 4


class SlicedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(IN, WIDTH)
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        h = torch.tanh(self.embed(x))
        w = self.head.weight[:, :WIDTH]  # every column kept: an alias
        if isinstance(w, DTensor):
            w = w.full_tensor()
        return h @ w.t() + self.head.bias


def columns_split(model: nn.Module, tp_mesh) -> None:
    """The head's weight distributed over the tensor-parallel mesh by columns (``Shard(1)``)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    head = model.get_submodule("head")
    head.weight = nn.Parameter(distribute_tensor(head.weight.detach(), tp_mesh, [Shard(1)]))


SCENARIO = Scenario(
    model=SlicedHead,
    batch=randn_batch(),
    sharding=Sharding(tp=2, tp_plan=columns_split),
    world_sizes=(2, 4),
    patches=("alias_sharding_strategy",),
    expect=(Expect(status="error", torch=">=2.9,<2.10", match="aten.alias.default does not have a sharding strategy",
                   fixed_by="alias_sharding_strategy", upstream="pytorch/pytorch#170427",
                   why="2.9 registers no DTensor sharding strategy for aten.alias.default"),),
)
