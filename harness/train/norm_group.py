"""Re-home sharded grads onto a group that has only one backend (NCCL-only simulation).

On a CPU-only machine an NCCL-only group is simulated by a group whose only backend
serves another device type (``"cuda:gloo"``): an all-reduce of a CPU tensor over it
raises exactly "No backend type associated with device type cpu". FSDP2 itself needs a
CPU-capable group, so only the grads move: each sharded grad is rebuilt as a DTensor with
the same local tensor (shared storage), placements, shape and stride on a mesh over the
simulated group. ``DTensor.from_local`` would move the local tensor to the mesh's device,
so the DTensor is built from its spec directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

__all__ = ["rehome"]


def rehome(params: list[nn.Parameter], backend: str) -> Callable[[], None]:
    """Point every param's DTensor grad at a mesh over a new ``backend`` group; returns an undo."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    group = dist.new_group(backend=backend)  # collective: every rank clips, so every rank gets here
    device_type = backend.split(":")[0] if ":" in backend else ("cuda" if backend == "nccl" else "cpu")
    mesh = DeviceMesh.from_group(group, device_type=device_type)
    originals: list[tuple[nn.Parameter, torch.Tensor]] = []
    for p in params:
        g = p.grad
        if not isinstance(g, DTensor):
            continue
        if g.device_mesh.ndim != 1:
            raise ValueError("Groups.norm_backend supports 1-D meshes only")
        spec = DTensorSpec(mesh, tuple(g.placements), tensor_meta=TensorMeta(g.shape, g.stride(), g.dtype))
        originals.append((p, g))
        p.grad = DTensor(g.to_local(), spec, requires_grad=False)

    def restore() -> None:
        for p, g in originals:
            p.grad = g
        dist.destroy_process_group(group)

    return restore
