"""J: gradient clipping over parameters on two meshes: experts on ("dp", "tp") by expert parallel, dense layers on "dp".

Expert parallel plus FSDP2, as MoE stacks shard it: the stacked expert weights are
distributed over the mesh's second dim (the expert-parallel dim, named "tp" by the
harness's 2-D mesh) with ``Shard(0)`` on the expert dim, then ``fully_shard`` over "dp"
makes them 2-D DTensors on the root ("dp", "tp") mesh; the dense layers are sharded over
the "dp" sub-mesh only. The ranks of one "dp" index see the same tokens, each computes
its own experts, and the partial outputs are summed over the expert-parallel dim.

torch's ``clip_grad_norm_`` stacks per-parameter norms that are DTensors on different
meshes: "All operands in aten.stack.default must have the same mesh"
(pytorch/pytorch#180346, open; stacks carry their own clip: torchtitan's expert-parallel
clip, NVIDIA-NeMo/Automodel#2012). Fixed by reducing each mesh's partial norm over the
mesh dims its grads are sharded on, then combining the per-mesh totals.
"""

import torch
from torch import nn

from harness.spec import Clip, Expect, Optim, Scenario, Sharding
from scenarios._models import IN, randn_batch

EXPERTS, WIDTH, HIDDEN, OUT = 4, 9, 6, 3


def _ep_enter(t: torch.Tensor, mesh) -> torch.Tensor:
    """``t`` as it is (the same on every rank of the expert-parallel mesh); in backward its
    gradient, which each rank has only for its own experts, is summed over the mesh."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def _ep_combine(partial: torch.Tensor, mesh) -> torch.Tensor:
    """Sum each rank's partial expert output over the expert-parallel mesh; in backward the
    gradient flows to every rank's partial unchanged."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    summed = DTensor.from_local(partial, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()])
    return summed.to_local()


class Experts(nn.Module):
    """``EXPERTS`` two-layer experts stacked into 3-D weights; each token's output is the
    gate-weighted sum of every expert's output (soft routing, so every expert gets a grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(EXPERTS, WIDTH, HIDDEN) / WIDTH**0.5)
        self.w_out = nn.Parameter(torch.randn(EXPERTS, HIDDEN, WIDTH) / HIDDEN**0.5)

    def forward(self, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        w_in, w_out, first, mesh = self.w_in, self.w_out, 0, None
        if isinstance(w_in, DTensor):  # expert parallel: this rank holds experts first .. first + local - 1
            mesh = w_in.device_mesh
            w_in, w_out = w_in.to_local(), w_out.to_local()
            first = mesh.get_local_rank() * w_in.shape[0]
            x, gates = _ep_enter(x, mesh), _ep_enter(gates, mesh)
        out = gates[:, first, None] * (torch.tanh(x @ w_in[0]) @ w_out[0])
        for e in range(1, w_in.shape[0]):
            out = out + gates[:, first + e, None] * (torch.tanh(x @ w_in[e]) @ w_out[e])
        return out if mesh is None else _ep_combine(out, mesh)


class TinyMoE(nn.Module):
    """Dense embed, router and head around one stacked-experts block (residual)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(IN, WIDTH)
        self.router = nn.Linear(WIDTH, EXPERTS)
        self.experts = Experts()
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        gates = torch.softmax(self.router(h), dim=-1)
        return self.head(h + self.experts(h, gates))


def expert_parallel(model: nn.Module, ep_mesh) -> None:
    """Distribute the stacked expert weights over the expert-parallel mesh (Shard(0): experts)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    experts = model.get_submodule("experts")
    for name, p in list(experts.named_parameters(recurse=False)):
        setattr(experts, name, nn.Parameter(distribute_tensor(p.detach(), ep_mesh, [Shard(0)])))


SCENARIO = Scenario(
    model=TinyMoE,
    batch=randn_batch(),
    sharding=Sharding(units=("experts",), tp=2, tp_plan=expert_parallel),
    clip=Clip(max_norm=0.05),
    optimizer=Optim(kind="sgd"),  # AdamW would blow the expert-parallel sum's rounding noise up
    world_sizes=(2, 4),
    patches=("clip_grad_norm",),
    timeout_s=30,
    expect=(Expect(status="error", match="must have the same mesh", fixed_by="clip_grad_norm",
                   upstream="pytorch/pytorch#180346",
                   why="torch stacks per-parameter norms of DTensors on the ('dp', 'tp') and 'dp' meshes"),),
)
