"""Gather full (unsharded) copies of a cell's sharded tensors onto its first rank.

Fast path, for DTensors whose placements are all ``Shard``/``Replicate`` (FSDP2 and
HSDP): every rank sends its local pieces with their global offsets in one
``gather_object``, and the first rank writes them into full tensors. One collective per
snapshot instead of one per tensor (at 4 ranks on 2 cores the per-tensor all-gathers
were most of a cell's time). Other placements (tensor parallel's ``_StridedShard``, ...)
take the general path: agree on presence, then ``full_tensor()`` each.

Both paths report grad presence that differs across ranks instead of desynchronizing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = ["gather_full", "plain_placements"]

Full = dict[str, "torch.Tensor | None"]


def plain_placements(params: list[torch.Tensor]) -> bool:
    """Whether every DTensor param is placed with plain ``Shard``/``Replicate`` (the fast path)."""
    return all(not isinstance(p, DTensor) or all(type(pl) in (Shard, Replicate) for pl in p.placements)
               for p in params)


def gather_full(tensors: dict[str, torch.Tensor | None], *, rank: int, world: int,
                fast: bool) -> tuple[Full, dict[str, list[int]]]:
    """Full CPU copies by name on rank 0 (None where absent on some rank), and names whose
    presence differed across ranks with the ranks that had one. Other ranks get empty dicts.
    Collective: every rank of the cell calls it with the same names."""
    return _fast(tensors, rank, world) if fast else _general(tensors, rank, world)


def _pieces(t: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.Tensor]:
    if not isinstance(t, DTensor):
        return tuple(t.shape), t.dtype, (0,) * t.dim(), t.detach().to("cpu", copy=True)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = t.to_local()
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    assert tuple(local.shape) == tuple(shape), (tuple(local.shape), shape)
    return tuple(t.shape), t.dtype, tuple(offset), local.detach().to("cpu", copy=True)


def _fast(tensors: dict[str, torch.Tensor | None], rank: int, world: int) -> tuple[Full, dict[str, list[int]]]:
    mine = {n: (None if t is None else _pieces(t)) for n, t in tensors.items()}
    everyone: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if rank != 0:
        return {}, {}
    assert everyone is not None
    full: Full = {}
    inconsistent: dict[str, list[int]] = {}
    for name in tensors:
        have = [r for r in range(world) if everyone[r][name] is not None]
        if len(have) < world:
            full[name] = None
            if have:
                inconsistent[name] = have
            continue
        shape, dtype, _, _ = everyone[0][name]
        out = torch.empty(shape, dtype=dtype)
        for r in range(world):
            _, _, offset, local = everyone[r][name]
            out[tuple(slice(o, o + n) for o, n in zip(offset, local.shape))] = local
        full[name] = out
    return full, inconsistent


def _general(tensors: dict[str, torch.Tensor | None], rank: int, world: int) -> tuple[Full, dict[str, list[int]]]:
    have: list[Any] = [None] * world
    dist.all_gather_object(have, [n for n, t in tensors.items() if t is not None])
    full: Full = {}
    inconsistent: dict[str, list[int]] = {}
    for name, t in tensors.items():
        ranks = [r for r in range(world) if name in have[r]]
        full[name] = _full_tensor(t) if len(ranks) == world else None
        if ranks and len(ranks) < world:
            inconsistent[name] = ranks
    return (full, inconsistent) if rank == 0 else ({}, {})


def _full_tensor(t: torch.Tensor | None) -> torch.Tensor:
    """A private CPU copy of the full tensor (collective for DTensors: every rank must call it)."""
    assert t is not None
    if isinstance(t, DTensor):
        local = t.to_local()
        mesh_device = t.device_mesh.device_type
        if local.device.type != mesh_device:  # CPU-offloaded shard: gather on the mesh device
            local = local.to(mesh_device)
        t = DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
        t = t.full_tensor()
    # clone: on a 1-rank shard dim the full tensor can alias the live grad or param
    return t.detach().to("cpu", copy=True)
