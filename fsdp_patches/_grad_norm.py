"""Total gradient norm over plain and DTensor (FSDP2 sharded, CPU-offloaded) grads.

Local norms are computed where each grad lives, one device and dtype group at a time;
per-mesh partials are all-reduced over the mesh dims on which the grad is sharded (see
``_grad_reduce`` for the device the reduction runs on). Empty local shards are skipped
(bug H): the identity of both the max of non-negative norms and of the sum of p-th
powers is 0, so every rank reaches every collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ._grad_reduce import all_reduce
from ._grad_tensors import (
    Partial,
    TensorOrTensors,
    as_param_list,
    group_by_device_and_dtype,
    is_dtensor,
    is_shard_placement,
    local_data,
    use_foreach,
)

__all__ = ["get_total_grad_norm", "total_norm_of_grads"]

_PARTIAL_OPS = {"sum": "sum", "avg": "sum", "max": "max", "min": "min"}


def _materialize_partial_dims(grad: Any) -> tuple[torch.Tensor, list[int]]:
    """Return (local tensor with Partial mesh dims reduced, mesh dims to reduce norms over).

    Norms are summed (or maxed) over Shard dims only (``_StridedShard`` included: FSDP2
    over an expert- or tensor-parallel dim): a Replicate dim holds copies and must not be
    counted twice. A Partial dim holds unreduced summands whose norms do not add up, so the
    local tensor is first all-reduced over it (which makes it Replicate). Any other
    placement raises rather than being counted as a copy.
    """
    mesh = grad.device_mesh
    local = grad.to_local()
    reduce_dims: list[int] = []
    for mesh_dim, placement in enumerate(grad.placements):
        if is_shard_placement(placement):
            reduce_dims.append(mesh_dim)
        elif placement.is_replicate():
            continue
        elif placement.is_partial():
            op = getattr(placement, "reduce_op", None)
            if type(placement) is not Partial or op not in _PARTIAL_OPS:
                raise NotImplementedError(
                    f"gradient norm of a DTensor with placement {placement!r} is not supported"
                )
            dim_group = mesh.get_group(mesh_dim)
            local = all_reduce(local, _PARTIAL_OPS[op], dim_group, mesh.device_type)
            if op == "avg":
                local = local / mesh.size(mesh_dim)
        else:
            raise NotImplementedError(f"gradient norm of a DTensor with placement {placement!r} is not supported")
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
    for (device, _dtype), group in group_by_device_and_dtype(
        t for t in tensors if t.numel() > 0
    ).items():
        if use_foreach(foreach, device):
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
def total_norm_of_grads(
    grads: list[torch.Tensor], norm_type: float, foreach: bool | None
) -> torch.Tensor:
    p = float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    out_device = local_data(grads[0]).device
    acc_dtype = _accumulation_dtype(g.dtype for g in grads)

    plain: list[torch.Tensor] = []
    # (mesh, mesh dims to reduce over) -> local tensors; insertion order is the same
    # on every rank because it follows the parameter order.
    domains: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    for g in grads:
        if not is_dtensor(g):
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
            partial = all_reduce(partial, op, mesh.get_group(mesh_dim), mesh.device_type)
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
    grads = [p.grad for p in as_param_list(parameters) if p.grad is not None]
    return total_norm_of_grads(grads, norm_type, foreach)
