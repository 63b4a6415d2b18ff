"""Train one scenario with FSDP2 on this rank and snapshot what it produced.

Called by ``harness.worker`` with the cell's default process group already initialized.
Every rank runs the same collectives in the same order; rank 0 keeps the snapshots.
Grad presence is exchanged first (an object all-gather), so a parameter whose presence
differs across ranks is reported instead of desynchronizing the gather.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from harness.norm_group import rehome
from harness.plan import Cell
from harness.snapshot import StepSnapshot
from harness.spec import Ctx, Scenario

__all__ = ["build_model", "train"]


def train(
    scenario: Scenario,
    cell: Cell,
    utilities: dict[str, Any],
    rank: int,
    world: int,
) -> list[StepSnapshot]:
    device = torch.device(cell.device, torch.cuda.current_device()) if cell.device == "cuda" else torch.device("cpu")
    mesh = _mesh(scenario, cell, world)
    model = build_model(scenario, mesh, cell.device)
    named = dict(model.named_parameters())
    opt = scenario.optimizer.build(named.values())
    gather = _Gatherer(world=world)
    snapshots = []
    for step in range(scenario.steps):
        for k, micro_batch in enumerate(scenario.schedule):
            model.set_requires_gradient_sync(micro_batch.sync)
            if mesh.ndim == 2:
                model.set_requires_all_reduce(micro_batch.all_reduce)
            ctx = Ctx(rank=rank, world_size=world, step=step, micro_batch=k)
            torch.manual_seed(scenario.batch_seed(ctx))
            batch = scenario.batch(ctx).to(device)
            scenario.forward(model, batch, ctx).backward()
        snap = StepSnapshot(step=step)
        if scenario.grad_scale is not None:
            _scale_grads(list(named.values()), scenario.grad_scale, device, utilities.get("scale_grads"))
        snap.grads, snap.inconsistent = gather.grads(named)
        if scenario.clip is not None:
            total = _clip(scenario, cell, named, utilities.get("clip_grad_norm"))
            snap.grad_norm = total
            snap.clipped, _ = gather.grads(named)
        opt.step()
        snap.params = {n: _full(p.detach()) for n, p in named.items()}
        snap.opt_state = {n: bool(opt.state.get(p)) for n, p in named.items()}
        opt.zero_grad(set_to_none=(step % 2 == 0))
        snapshots.append(snap)
    return snapshots


def _mesh(scenario: Scenario, cell: Cell, world: int) -> DeviceMesh:
    shape = scenario.sharding.mesh_shape(world)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    return init_device_mesh(cell.device, shape, mesh_dim_names=names)


def build_model(scenario: Scenario, mesh: DeviceMesh, device_type: str) -> nn.Module:
    """The scenario's model (seeded like the reference), sharded as it declares."""
    torch.manual_seed(scenario.seed)
    model = scenario.model()
    s = scenario.sharding
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": s.reshard_after_forward}
    if s.param_dtype is not None or s.reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=s.param_dtype, reduce_dtype=s.reduce_dtype)
    # pinned host memory needs an accelerator; on CPU the grads stay unpinned
    kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type != "cpu") if s.offload else OffloadPolicy()
    for fqn in s.units:
        fully_shard(model.get_submodule(fqn), **kwargs)
    fully_shard(model, **kwargs)
    if s.reduce_scatter_unused_params and hasattr(model, "set_reduce_scatter_unused_params"):
        model.set_reduce_scatter_unused_params(True)
    return model


def _scale_grads(params: list[nn.Parameter], factor: float, device: torch.device, util: Any) -> None:
    """The recipe's accumulation scaling: a 0-dim scaler on the compute device."""
    scaler = torch.tensor(factor, device=device)
    if util is not None:
        util(params, scaler)
        return
    for p in params:
        if p.grad is not None:
            p.grad *= scaler


def _clip(scenario: Scenario, cell: Cell, named: dict[str, nn.Parameter], util: Any) -> float:
    clip = scenario.clip
    assert clip is not None
    params = [p for p in named.values() if p.grad is not None]
    backend = scenario.norm_group_backend.get(cell.device)
    restore = rehome(params, backend) if backend else None
    try:
        fn = util if util is not None else torch.nn.utils.clip_grad_norm_
        total = fn(params, clip.max_norm, clip.norm_type, foreach=clip.foreach)
    finally:
        if restore is not None:
            restore()
    if isinstance(total, DTensor):
        total = total.full_tensor()
    return float(total)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A private CPU copy of the full tensor (collective for DTensors: every rank must call it)."""
    if isinstance(t, DTensor):
        local = t.to_local()
        mesh_device = t.device_mesh.device_type
        if local.device.type != mesh_device:  # CPU-offloaded shard: gather on the mesh device
            local = local.to(mesh_device)
        t = DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
        t = t.full_tensor()
    # clone: on a 1-rank shard dim the full tensor can alias the live grad or param
    return t.detach().to("cpu", copy=True)


class _Gatherer:
    """Gathers full grads after agreeing on grad presence (an object all-gather first)."""

    def __init__(self, *, world: int) -> None:
        self.world = world

    def grads(self, named: dict[str, nn.Parameter]) -> tuple[dict[str, torch.Tensor | None], dict[str, list[int]]]:
        mine = [n for n, p in named.items() if p.grad is not None]
        have: list[Any] = [None] * self.world
        dist.all_gather_object(have, mine)
        grads: dict[str, torch.Tensor | None] = {}
        inconsistent: dict[str, list[int]] = {}
        for name, p in named.items():
            ranks = [r for r in range(self.world) if name in have[r]]
            if len(ranks) == self.world:
                grads[name] = _full(p.grad)
            else:
                grads[name] = None
                if ranks:
                    inconsistent[name] = ranks
        return grads, inconsistent
