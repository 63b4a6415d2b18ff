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

This module is the public face: clipping and scaling are here, the norm computation in
``_grad_norm`` and the choice of reduction device in ``_grad_reduce``.
"""

from __future__ import annotations

from typing import Any

import torch

from ._grad_norm import get_total_grad_norm, total_norm_of_grads
from ._grad_tensors import TensorOrTensors, as_param_list, group_by_device_and_dtype, local_data, use_foreach

__all__ = [
    "clip_grad_norm_",
    "get_total_grad_norm",
    "scale_grads_",
]


@torch.no_grad()
def _mul_grads_(grads: list[torch.Tensor], scaler: float | torch.Tensor, foreach: bool | None) -> None:
    if isinstance(scaler, torch.Tensor):
        if scaler.numel() != 1:
            raise ValueError(f"scaler must be a float or a 0-dim tensor, got shape {tuple(scaler.shape)}")
        scaler = scaler.detach().reshape(())
    per_device: dict[torch.device, Any] = {}
    for (device, _dtype), group in group_by_device_and_dtype(local_data(g) for g in grads).items():
        if isinstance(scaler, torch.Tensor):
            if device not in per_device:
                per_device[device] = scaler.to(device)
            factor: Any = per_device[device]
        else:
            factor = float(scaler)
        if use_foreach(foreach, device):
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
    grads = [p.grad for p in as_param_list(parameters) if p.grad is not None]
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
    params = as_param_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    total_norm = total_norm_of_grads(grads, norm_type, foreach)
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
