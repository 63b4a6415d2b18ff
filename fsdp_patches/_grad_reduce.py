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


def _gloo_backend_of(group: Any) -> Any:
    """The gloo backend ``group`` holds for one of the device types it serves, or None.

    Needed only when ``group`` has no backend for any device present in this process:
    e.g. a ``cuda:gloo``-only group on a CPU-only machine, which is how the project
    reproduces the NCCL-only situation of bug F without a GPU. Gloo reduces CPU tensors
    whatever device type it was registered for, so the scalar goes through the group's own
    backend: no new group, so nothing depends on how many groups each member has made
    (a group made for this, with ``use_local_synchronization=True``, is named from the
    calling rank's count of registered groups: members that had made different numbers of
    groups waited under different names until the timeout). With a real NCCL group on a
    GPU machine the scalar goes to the GPU instead and this is never called.
    """
    for device_type in _group_device_types(group):
        backend = group._get_backend(torch.device(device_type))
        if type(backend).__name__ == "ProcessGroupGloo":
            return backend
    return None


def reduction_target(group: Any, mesh_device_type: str) -> tuple[torch.device, Any]:
    """Choose (device, group) for a collective on a small tensor over ``group``.

    Order: the mesh's own device type when the group serves it and it is present here
    (keeps accelerator-resident grads off the host); otherwise CPU when the group has
    a CPU backend (``cpu:gloo,cuda:nccl``, plain ``gloo``); otherwise any served device
    type present here (an NCCL-only group with CPU-offloaded grads: move the scalar to
    the GPU - the fix of bug F); otherwise the group's own gloo backend (returned in place of
    the group). The choice depends only on the group and the mesh, so all ranks agree on it.
    """
    served = _group_device_types(group)
    if mesh_device_type in served and _device_type_available(mesh_device_type):
        return _current_device(mesh_device_type), group
    if "cpu" in served:
        return torch.device("cpu"), group
    for device_type in served:
        if _device_type_available(device_type):
            return _current_device(device_type), group
    backend = _gloo_backend_of(group)
    if backend is None:
        raise RuntimeError(f"no backend of this process group can reduce a tensor here: it serves {served}, "
                           "none of which is present, and none of its backends is gloo")
    return torch.device("cpu"), backend


def all_reduce(tensor: torch.Tensor, op: str, group: Any, mesh_device_type: str) -> torch.Tensor:
    """All-reduce ``tensor`` over ``group`` on a device the group serves; returns a new tensor
    on ``tensor``'s device. ``op`` is one of "sum", "max", "min"."""
    import torch.distributed as dist

    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    device, target_group = reduction_target(group, mesh_device_type)
    work = tensor.detach().to(device, copy=True)
    if isinstance(target_group, dist.ProcessGroup):
        dist.all_reduce(work, op=reduce_op, group=target_group)
    else:  # a backend of the group (``_gloo_backend_of``): it takes the collective directly
        options = dist.AllreduceOptions()
        options.reduceOp = reduce_op
        target_group.allreduce([work], options).wait()
    return work.to(tensor.device)
