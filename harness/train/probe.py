"""The gloo AVG probe: whether FSDP2's gradient reduction in a cell sums where it should
average (before torch 2.9 gloo computes FSDP2's ReduceOp.AVG reduce-scatter as a sum,
pytorch/pytorch#162338), measured with the cell's patch set in force, before training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed.fsdp as fsdp_public
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from harness.plan.cells import Cell
from harness.scenario.spec import Scenario

__all__ = ["Probes", "measure_reduction", "reduction_sums"]


class Probes(Protocol):
    """Answers of the reduction probe measured before (``harness.rank.groups.ProbeCache``)."""

    def get(self, key: tuple) -> bool | None: ...

    def put(self, key: tuple, sums: bool) -> None: ...


def measure_reduction(scenario: Scenario, cell: Cell, model: nn.Module, mesh: DeviceMesh, device: torch.device,
                      probes: Probes | None, stamp: Callable[[str], object]) -> bool | None:
    """The probe's answer for a gloo-only cell (None elsewhere): measured in every gloo cell,
    since a sum where none is declared is a finding (``harness.rank.judging``). ``probes``:
    earlier answers with this patch set, by (backend, shard group, dtype); every rank of the
    group must hold the same, or some would skip the probe's collectives."""
    if "gloo" not in cell.backend or "nccl" in cell.backend:
        return None
    shard = _shard_mesh(mesh)
    dtype = _reduce_dtype(scenario, model)
    key = (cell.backend, cell.device, tuple(shard.mesh.flatten().tolist()), str(dtype))
    sums = probes.get(key) if probes is not None else None
    if sums is None:
        stamp("measure the reduction")
        sums = reduction_sums(shard, device, dtype)
        if probes is not None:
            probes.put(key, sums)
    return sums


def _shard_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh FSDP2 reduce-scatters over: the mesh itself, or its "shard" / "dp" dim."""
    names = mesh.mesh_dim_names or ()
    if mesh.ndim == 1:
        return mesh
    return mesh["shard"] if "shard" in names else mesh["dp"]


def _reduce_dtype(scenario: Scenario, model: nn.Module) -> torch.dtype:
    """The dtype FSDP2 reduces the scenario's grads in: its reduce dtype, else its compute
    dtype, else its first floating-point parameter's."""
    s = scenario.sharding
    floating = (p.dtype for p in model.parameters() if p.is_floating_point())
    return s.reduce_dtype or s.param_dtype or next(floating, torch.float32)


def reduction_sums(mesh: DeviceMesh, device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Whether FSDP2's gradient reduction over ``mesh`` sums where it should average, as
    measured with the patch set in force: a one-layer model whose grad is 1 on every rank
    comes back as the shard group's size instead of 1 (gloo computes FSDP2's ReduceOp.AVG
    reduce-scatter as a sum before torch 2.9, unless a patch makes FSDP2 sum and divide
    itself). FSDP2 asks for AVG only for some reduce dtypes (fp32 and bf16; fp16 is summed
    with its own divide factors), so the probe reduces in ``dtype``, the cell's. The
    reference models the sum only where this says so."""
    if mesh.size() == 1:
        return False
    probe = nn.Linear(1, 2 * mesh.size(), bias=False, device=device, dtype=dtype)  # two rows of the weight per rank
    nn.init.ones_(probe.weight)
    fsdp_public.fully_shard(probe, mesh=mesh)
    probe(torch.ones(1, 1, device=device, dtype=dtype)).sum().backward()
    local = probe.weight.grad.to_local()
    assert local.numel() > 0, "every rank holds a shard of the probe"
    return bool(torch.allclose(local, torch.full_like(local, float(mesh.size()))))
