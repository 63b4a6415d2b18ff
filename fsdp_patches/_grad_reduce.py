"""Where to all-reduce a small tensor (a norm partial) over a mesh's process group.

The fix of bug F lives here: with ``CPUOffloadPolicy`` the local norms are on CPU but
the mesh's group may serve only an accelerator (NCCL only). ``reduction_target`` picks a
device the group actually serves, so the scalar is moved there instead of handing a CPU
tensor to a group without a CPU backend.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["all_reduce", "reduction_target"]

# (source process group) -> gloo process group over the same ranks; see
# _gloo_group_like for why such a group may be needed at all.
_GLOO_FALLBACK_GROUPS: dict[Any, Any] = {}


def _group_device_types(group: Any) -> list[str]:
    """Device types for which ``group`` has a backend (e.g. ``["cpu", "cuda"]``)."""
    return [d.type for d in group._device_types]


def _device_type_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


def _current_device(device_type: str) -> torch.device:
    if device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, device_type, None)
    current = getattr(module, "current_device", None)
    if callable(current):
        return torch.device(device_type, current())
    return torch.device(device_type)


def _gloo_group_like(group: Any) -> Any:
    """A cached gloo group over the ranks of ``group``.

    Needed only when ``group`` has no backend for any device present in this process:
    e.g. a ``cuda:gloo``-only group on a CPU-only machine, which is how the project
    reproduces the NCCL-only situation of bug F without a GPU. With a real NCCL group
    on a GPU machine the scalar goes to the GPU instead and this is never called.
    Every member of ``group`` reaches this point in the same collective call, so the
    group is created with local synchronization (non-members need not take part).
    """
    import torch.distributed as dist

    cached = _GLOO_FALLBACK_GROUPS.get(group)
    if cached is not None:
        try:
            dist.get_process_group_ranks(cached)  # still registered (not destroyed)?
            return cached
        except (KeyError, ValueError, RuntimeError):  # destroyed: forget it
            del _GLOO_FALLBACK_GROUPS[group]
    ranks = sorted(dist.get_process_group_ranks(group))
    new = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
    _GLOO_FALLBACK_GROUPS[group] = new
    return new


def reduction_target(group: Any, mesh_device_type: str) -> tuple[torch.device, Any]:
    """Choose (device, group) for a collective on a small tensor over ``group``.

    Order: the mesh's own device type when the group serves it and it is present here
    (keeps accelerator-resident grads off the host); otherwise CPU when the group has
    a CPU backend (``cpu:gloo,cuda:nccl``, plain ``gloo``); otherwise any served device
    type present here (an NCCL-only group with CPU-offloaded grads: move the scalar to
    the GPU - the fix of bug F); otherwise a gloo group over the same ranks.
    The choice depends only on the group and the mesh, so all ranks agree on it.
    """
    served = _group_device_types(group)
    if mesh_device_type in served and _device_type_available(mesh_device_type):
        return _current_device(mesh_device_type), group
    if "cpu" in served:
        return torch.device("cpu"), group
    for device_type in served:
        if _device_type_available(device_type):
            return _current_device(device_type), group
    return torch.device("cpu"), _gloo_group_like(group)


def all_reduce(tensor: torch.Tensor, op: str, group: Any, mesh_device_type: str) -> torch.Tensor:
    """All-reduce ``tensor`` over ``group`` on a device the group serves; returns a new tensor
    on ``tensor``'s device. ``op`` is one of "sum", "max", "min"."""
    import torch.distributed as dist

    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    device, target_group = reduction_target(group, mesh_device_type)
    work = tensor.detach().to(device, copy=True)
    dist.all_reduce(work, op=reduce_op, group=target_group)
    return work.to(tensor.device)
