"""Gradient norm, clipping and scaling that work on FSDP2 sharded, CPU-offloaded grads.

``torch.nn.utils.clip_grad_norm_`` misbehaves on FSDP2 gradients in three ways that
this module avoids (see bugs F, G and H in the project's bug corpus):

* **F** - with ``CPUOffloadPolicy`` the sharded grads are DTensors whose mesh is an
  accelerator mesh but whose local tensors live on CPU. Torch all-reduces the local
  CPU norm over the mesh's process group; a group without a CPU backend (NCCL only)
  raises ``RuntimeError: No backend type associated with device type cpu``.
  Here the local norms are computed where the grads live and the reduction scalar is
  moved to a device that the group actually serves.
* **G** - ``p.grad *= scaler`` with an accelerator 0-dim scaler and CPU grads raises
  "Expected all tensors to be on the same device". Here grads are grouped by device
  and the scaler is moved to each group's device.
* **H** - ``norm_type=inf`` on an empty local shard (a parameter with fewer rows than
  ranks) raises on that rank only, so the other ranks wait forever in the collective.
  Here empty local tensors are skipped (the identity of both the max of non-negative
  norms and of the sum of p-th powers is 0), so every rank reaches every collective.

The reduction is collective: every rank that holds a DTensor grad must call these
functions with the same parameters in the same order (as it must for torch's own
``clip_grad_norm_``). Works on torch 2.7 .. 2.15 and on any device type.
"""

from __future__ import annotations

import math
import types
import warnings
from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "clip_grad_norm_",
    "get_total_grad_norm",
    "scale_grads_",
]

try:  # public DTensor API since torch 2.5; private module before
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial
except ImportError:  # pragma: no cover - torch.distributed unavailable or very old
    try:
        from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
        from torch.distributed._tensor.placement_types import (  # type: ignore[no-redef]
            Partial,
        )
    except ImportError:
        DTensor = None  # type: ignore[assignment,misc]
        Partial = None  # type: ignore[assignment,misc]

try:
    from torch.utils._foreach_utils import _device_has_foreach_support
except ImportError:  # pragma: no cover - kept for torch builds without the helper

    def _device_has_foreach_support(device: torch.device) -> bool:
        return device.type in ("cpu", "cuda", "xpu")


TensorOrTensors = torch.Tensor | Iterable[torch.Tensor]

# (source process group) -> gloo process group over the same ranks; see
# _gloo_group_like for why such a group may be needed at all.
_GLOO_FALLBACK_GROUPS: dict[Any, Any] = {}


def _as_param_list(parameters: TensorOrTensors) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    params = list(parameters)
    if is_generator and not params:
        warnings.warn(
            "`parameters` is an empty generator, no gradient clipping will occur.",
            stacklevel=3,
        )
    return params


def _is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's data (the local shard of a DTensor)."""
    if _is_dtensor(t):
        # Under no_grad, to_local() returns the DTensor's own local tensor, so in-place
        # ops on it update the DTensor.
        return t.to_local()  # type: ignore[union-attr]
    return t


def _use_foreach(foreach: bool | None, device: torch.device) -> bool:
    supported = _device_has_foreach_support(device)
    if foreach and not supported:
        raise RuntimeError(
            f"foreach=True was passed, but can't use the foreach API on {device.type} tensors"
        )
    return supported if foreach is None else bool(foreach)


def _group_by_device_and_dtype(
    tensors: Iterable[torch.Tensor],
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


# ----------------------------------------------------------------------------------
# Process-group plumbing
# ----------------------------------------------------------------------------------


def _group_device_types(group: Any) -> list[str]:
    """Device types for which ``group`` has a backend (e.g. ``["cpu", "cuda"]``)."""
    try:
        return [d.type for d in group._device_types]
    except AttributeError:  # pragma: no cover - every supported torch has the property
        import torch.distributed as dist

        config = dist.get_backend_config(group)  # e.g. "cpu:gloo,cuda:nccl"
        types_ = [part.split(":", 1)[0] for part in config.split(",") if ":" in part]
        return types_ or ["cpu", "cuda"]


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


def _reduction_target(group: Any, mesh_device_type: str) -> tuple[torch.device, Any]:
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


def _all_reduce(tensor: torch.Tensor, op: str, group: Any, mesh_device_type: str) -> torch.Tensor:
    """All-reduce ``tensor`` over ``group`` on a device the group serves; returns a new tensor
    on ``tensor``'s device. ``op`` is one of "sum", "max", "min"."""
    import torch.distributed as dist

    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    device, target_group = _reduction_target(group, mesh_device_type)
    work = tensor.detach().to(device, copy=True)
    dist.all_reduce(work, op=reduce_op, group=target_group)
    return work.to(tensor.device)


# ----------------------------------------------------------------------------------
# Norms
# ----------------------------------------------------------------------------------

_PARTIAL_OPS = {"sum": "sum", "avg": "sum", "max": "max", "min": "min"}


def _materialize_partial_dims(grad: Any) -> tuple[torch.Tensor, list[int]]:
    """Return (local tensor with Partial mesh dims reduced, mesh dims to reduce norms over).

    Norms are summed (or maxed) over Shard dims only: a Replicate dim holds copies and
    must not be counted twice. A Partial dim holds unreduced summands whose norms do not
    add up, so the local tensor is first all-reduced over it (which makes it Replicate).
    """
    mesh = grad.device_mesh
    local = grad.to_local()
    reduce_dims: list[int] = []
    for mesh_dim, placement in enumerate(grad.placements):
        if placement.is_shard():
            reduce_dims.append(mesh_dim)
        elif placement.is_partial():
            op = getattr(placement, "reduce_op", None)
            if type(placement) is not Partial or op not in _PARTIAL_OPS:
                raise NotImplementedError(
                    f"gradient norm of a DTensor with placement {placement!r} is not supported"
                )
            dim_group = mesh.get_group(mesh_dim)
            local = _all_reduce(local, _PARTIAL_OPS[op], dim_group, mesh.device_type)
            if op == "avg":
                local = local / mesh.size(mesh_dim)
    return local, reduce_dims


def _norm_p_accumulate(
    tensors: list[torch.Tensor], p: float, foreach: bool | None, acc_dtype: torch.dtype
) -> torch.Tensor | None:
    """Per-device partial: sum of ||t||_p^p (or max/min for +-inf, count for p=0).

    Local norms are computed on each tensor's own device, one device (and dtype) group at
    a time, so no multi-tensor kernel ever sees pointers of two devices. Empty tensors are
    skipped. Returns a 0-dim tensor on the device of the first non-empty group, or None.
    """
    partials: list[torch.Tensor] = []
    for (device, _dtype), group in _group_by_device_and_dtype(
        t for t in tensors if t.numel() > 0
    ).items():
        if _use_foreach(foreach, device):
            norms = list(torch._foreach_norm(group, p))
        else:
            norms = [torch.linalg.vector_norm(t, p) for t in group]
        stacked = torch.stack([n.to(acc_dtype) for n in norms])
        if math.isinf(p):
            partial = stacked.max() if p > 0 else stacked.min()
        elif p == 0:
            partial = stacked.sum()
        else:
            partial = stacked.pow(p).sum()
        partials.append(partial)
    if not partials:
        return None
    out_device = partials[0].device
    return _combine([x.to(out_device) for x in partials], p)


def _combine(partials: list[torch.Tensor], p: float) -> torch.Tensor:
    stacked = torch.stack(partials)
    if math.isinf(p):
        return stacked.max() if p > 0 else stacked.min()
    return stacked.sum()


def _identity(p: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    value = math.inf if p == -math.inf else 0.0
    return torch.tensor(value, dtype=dtype, device=device)


def _accumulation_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    wide = {torch.float64, torch.complex128}
    return torch.float64 if any(d in wide for d in dtypes) else torch.float32


def _result_dtype(dtypes: list[torch.dtype]) -> torch.dtype:
    """The dtype torch's own clip_grad_norm_ would return: the promoted norm dtype."""
    if not dtypes:
        return torch.get_default_dtype()
    result = dtypes[0]
    for d in dtypes[1:]:
        result = torch.promote_types(result, d)
    return torch.empty((), dtype=result).abs().dtype  # complex -> its real dtype


@torch.no_grad()
def _total_norm_of_grads(
    grads: list[torch.Tensor], norm_type: float, foreach: bool | None
) -> torch.Tensor:
    p = float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    out_device = _local(grads[0]).device
    acc_dtype = _accumulation_dtype(g.dtype for g in grads)

    plain: list[torch.Tensor] = []
    # (mesh, mesh dims to reduce over) -> local tensors; insertion order is the same
    # on every rank because it follows the parameter order.
    domains: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    for g in grads:
        if not _is_dtensor(g):
            plain.append(g)
            continue
        mesh = g.device_mesh  # type: ignore[union-attr]
        if mesh.get_coordinate() is None:  # this rank is not part of the mesh
            continue
        local, reduce_dims = _materialize_partial_dims(g)
        domains.setdefault((mesh, tuple(reduce_dims)), []).append(local)

    totals: list[torch.Tensor] = []
    local_plain = _norm_p_accumulate(plain, p, foreach, acc_dtype)
    if local_plain is not None:
        totals.append(local_plain.to(out_device))
    for (mesh, reduce_dims), locals_ in domains.items():
        partial = _norm_p_accumulate(locals_, p, foreach, acc_dtype)
        if partial is None:  # every local shard is empty here: contribute the identity
            partial = _identity(p, acc_dtype, torch.device("cpu"))
        op = "sum" if not math.isinf(p) else ("max" if p > 0 else "min")
        for mesh_dim in reduce_dims:
            partial = _all_reduce(partial, op, mesh.get_group(mesh_dim), mesh.device_type)
        totals.append(partial.to(out_device))

    if not totals:
        total = _identity(p, acc_dtype, out_device)
    else:
        total = _combine(totals, p)
    if not math.isinf(p) and p != 0:
        total = total.pow(1.0 / p)
    return total.to(_result_dtype([g.dtype for g in grads]))


def get_total_grad_norm(
    parameters: TensorOrTensors,
    norm_type: float = 2.0,
    *,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Total ``norm_type``-norm of the ``.grad`` of ``parameters``, as one vector.

    Grads may be plain tensors (counted as they are on this rank) or DTensors such as
    FSDP2 sharded grads, CPU-offloaded or not. For a DTensor the norm of its local
    tensor is computed on that tensor's device and the per-mesh partial (sum of p-th
    powers, or the max for ``inf``) is all-reduced over the mesh dims on which the grad
    is sharded (never over a Replicate dim, e.g. HSDP's replicate dim), on a device that
    the mesh's process group serves. Empty local shards are skipped.

    Collective: all ranks of each mesh must call it with the same parameters.

    ``norm_type=0`` counts the non-zero entries of the concatenated grads (sharding
    invariant); torch's own function instead counts the grads with a non-zero norm.

    Args:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is used.
        norm_type: p of the p-norm; ``float("inf")`` for the max norm.
        foreach: use ``torch._foreach_norm`` per device group (``None``: when the device
            supports it; ``True`` on an unsupported device raises ``RuntimeError``).

    Returns:
        A 0-dim tensor, equal on every rank, on the device of the first grad's local
        data (CPU when there is no grad).
    """
    grads = [p.grad for p in _as_param_list(parameters) if p.grad is not None]
    return _total_norm_of_grads(grads, norm_type, foreach)


@torch.no_grad()
def _mul_grads_(grads: list[torch.Tensor], scaler: float | torch.Tensor, foreach: bool | None) -> None:
    if isinstance(scaler, torch.Tensor):
        if scaler.numel() != 1:
            raise ValueError(f"scaler must be a float or a 0-dim tensor, got shape {tuple(scaler.shape)}")
        scaler = scaler.detach().reshape(())
    per_device: dict[torch.device, Any] = {}
    for (device, _dtype), group in _group_by_device_and_dtype(_local(g) for g in grads).items():
        if isinstance(scaler, torch.Tensor):
            if device not in per_device:
                per_device[device] = scaler.to(device)
            factor: Any = per_device[device]
        else:
            factor = float(scaler)
        if _use_foreach(foreach, device):
            torch._foreach_mul_(group, factor)
        else:
            for t in group:
                t.mul_(factor)


def scale_grads_(parameters: TensorOrTensors, scaler: float | torch.Tensor) -> None:
    """Multiply every ``.grad`` of ``parameters`` in place by ``scaler``.

    ``scaler`` is a float or a 0-dim tensor on any device; it is moved to each grad's
    device (grads are grouped by device), so an accelerator scaler works with
    CPU-offloaded grads (bug G). DTensor grads are scaled through their local tensors;
    no communication happens.
    """
    grads = [p.grad for p in _as_param_list(parameters) if p.grad is not None]
    _mul_grads_(grads, scaler, None)


def clip_grad_norm_(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Clip the grads of ``parameters`` in place to total norm ``max_norm``.

    Same semantics as ``torch.nn.utils.clip_grad_norm_``: the total norm is that of
    :func:`get_total_grad_norm`; each grad is multiplied, on its own device, by
    ``min(max_norm / (total_norm + 1e-6), 1.0)``.

    Args:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped.
        max_norm: max total norm of the grads.
        norm_type: p of the p-norm; ``float("inf")`` for the max norm.
        error_if_nonfinite: raise ``RuntimeError`` if the total norm is nan or inf.
        foreach: see :func:`get_total_grad_norm`.

    Returns:
        The total norm of the grads before clipping (0-dim tensor, equal on all ranks).
    """
    params = _as_param_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    total_norm = _total_norm_of_grads(grads, norm_type, foreach)
    if error_if_nonfinite and bool(torch.logical_or(total_norm.isnan(), total_norm.isinf())):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from "
            "`parameters` is non-finite, so it cannot be clipped. To disable "
            "this error and scale the gradients by the non-finite norm anyway, "
            "set `error_if_nonfinite=False`"
        )
    if not grads:
        return total_norm
    clip_coef = torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
    _mul_grads_(grads, clip_coef, foreach)
    return total_norm
