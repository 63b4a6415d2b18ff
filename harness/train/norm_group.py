"""Re-home sharded grads onto groups that have only one backend (NCCL-only simulation).

On a CPU-only machine an NCCL-only group is simulated by a group whose only backend
serves another device type (``"cuda:gloo"``): an all-reduce of a CPU tensor over it
raises exactly "No backend type associated with device type cpu". FSDP2 itself needs a
CPU-capable group, so only the grads move: each sharded grad is rebuilt as a DTensor with
the same local tensor (shared storage), placements, shape and stride on a mesh of the same
layout whose groups are such groups: one per dimension of the mesh, over the same ranks as
the original's (HSDP's shard groups are sub-groups of the world, so a fallback a patch
builds over the wrong ranks shows). ``DTensor.from_local`` would move the local tensor to
the mesh's device, so the DTensor is built from its spec directly.

The stand-in groups stay registered until the cell's groups are released (``harness.rank.groups``:
destroyed after the cell, freed one release later). Destroyed and freed as soon as the clip
returned, a group a patch had just reduced over deadlocked torch 2.7.1 now and then: its gloo
destructor joined a worker thread with the GIL held while that thread waited for the GIL to drop
the finished collective's tensor (pytorch/pytorch#154976; a rank's stacks showed the main thread
in the clip's return and a thread with no Python frame).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

__all__ = ["rehome"]


def _stand_in(mesh: DeviceMesh, backend: str, device_type: str) -> DeviceMesh:
    """A mesh of ``mesh``'s layout over ``backend`` groups (collective: every rank makes every
    group of every dimension, in one order)."""
    layout = mesh.mesh
    mine = []
    for dim in range(layout.ndim):
        rows = layout.movedim(dim, -1).reshape(-1, layout.shape[dim])  # each row: one group of this dim
        for ranks in rows.tolist():
            group = dist.new_group(ranks, backend=backend)
            if dist.get_rank() in ranks:
                mine.append(group)
    if layout.ndim == 1:
        return DeviceMesh.from_group(mine[0], device_type=device_type, mesh_dim_names=mesh.mesh_dim_names)
    return DeviceMesh.from_group(mine, device_type=device_type, mesh=layout.clone(), mesh_dim_names=mesh.mesh_dim_names)


def rehome(params: list[nn.Parameter], backend: str) -> Callable[[], None]:
    """Point every param's DTensor grad at a stand-in mesh over ``backend`` groups; returns an undo (the
    grads back; the groups stay until the cell's groups are released)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    device_type = backend.split(":")[0] if ":" in backend else ("cuda" if backend == "nccl" else "cpu")
    meshes: dict[int, DeviceMesh] = {}
    originals: list[tuple[nn.Parameter, torch.Tensor]] = []
    for p in params:
        g = p.grad
        if not isinstance(g, DTensor):
            continue
        if id(g.device_mesh) not in meshes:  # the same order on every rank: the parameters'
            meshes[id(g.device_mesh)] = _stand_in(g.device_mesh, backend, device_type)
        spec = DTensorSpec(meshes[id(g.device_mesh)], tuple(g.placements),
                           tensor_meta=TensorMeta(g.shape, g.stride(), g.dtype))
        originals.append((p, g))
        p.grad = DTensor(g.to_local(), spec, requires_grad=False)

    def restore() -> None:
        for p, g in originals:
            p.grad = g

    return restore
