"""Bug I: a unit frozen in its first forward and unfrozen later, under mixed precision.

FSDP2 resolves each param group's original and reduce dtypes once, in
``FSDPParamGroup._init_mp_dtypes`` at lazy init (the root's first forward). Since torch
2.8 (pytorch/pytorch#154103, which let frozen parameters have other dtypes) it looks only
at the parameters that require grad *then*; a group with none, e.g. a backbone frozen for
a warm-up, gets ``_orig_dtype = _reduce_dtype = None`` for good. Once unfrozen, its grads
are reduced in their own (compute) dtype and not cast back:

* fp32 parameters, ``param_dtype=bf16``: the bf16 sharded grad is assigned to the fp32
  parameter, "attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor
  with dtype 'float'" (``grad_dtype 'Float'`` from 2.10) at the first backward after
  unfreezing (pytorch/pytorch#186998);
* bf16 parameters with ``reduce_dtype=fp32``: a reduction in bf16 instead of fp32
  (silent), or, after no-sync micro-batches accumulated fp32 grads, an fp32 grad
  assigned to the bf16 parameter.

torch 2.14 (pytorch/pytorch#187376) falls back to the group's floating-point parameters
when none is trainable, if their dtypes agree. ``patch_fsdp_late_unfreeze_reduce_dtype``
does the same on 2.8 .. 2.13, after torch's resolution: it wraps the current
``_init_mp_dtypes`` and, only for a group that has no trainable parameter and was left
with both dtypes ``None``, sets them from its floating-point parameters when those agree
on one original and one reduce dtype. Groups resolved at lazy init before the install
keep their dtypes: install before the first forward.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ._compat import applicable, fsdp_param_group_class, torch_at_least
from ._wrapping import (
    PatchResult,
    active_wrapper_in_chain,
    already_installed,
    installed,
    make_wrapper,
    not_applicable,
    replace_attribute,
)

__all__ = [
    "drops_frozen_group_dtypes",
    "fill_frozen_group_dtypes",
    "patch_fsdp_late_unfreeze_reduce_dtype",
    "resolve_frozen_group_dtypes",
]

LATE_UNFREEZE_REDUCE_DTYPE = "late_unfreeze_reduce_dtype"
_METHOD = "_init_mp_dtypes"
_UNSET = object()


def fill_frozen_group_dtypes(group: Any) -> bool:
    """Give an all-frozen ``group`` the dtypes of its floating-point parameters.

    Only where torch left both ``_orig_dtype`` and ``_reduce_dtype`` ``None``, no
    parameter of the group requires grad, and the floating-point parameters agree on one
    ``orig_dtype`` and one ``reduce_dtype`` (as resolved per parameter by
    ``FSDPParam.init_dtype_attrs``). Returns whether it set them.
    """
    if getattr(group, "_orig_dtype", None) is not None or getattr(group, "_reduce_dtype", None) is not None:
        return False
    params = list(group.fsdp_params)
    if any(p.sharded_param.requires_grad for p in params):
        return False
    floating = [p for p in params if p.orig_dtype.is_floating_point]
    orig_dtypes = {p.orig_dtype for p in floating}
    reduce_dtypes = {p.reduce_dtype for p in floating}
    if len(orig_dtypes) != 1 or len(reduce_dtypes) != 1:
        return False
    group._orig_dtype = orig_dtypes.pop()
    group._reduce_dtype = reduce_dtypes.pop()
    return True


def resolve_frozen_group_dtypes(init_mp_dtypes: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """The patch's behaviour around ``FSDPParamGroup._init_mp_dtypes``: torch's
    resolution first, then ``fill_frozen_group_dtypes``."""
    result = init_mp_dtypes(self, *args, **kwargs)
    fill_frozen_group_dtypes(self)
    return result


class _FrozenProbeParam:
    """What ``_init_mp_dtypes`` reads of one ``FSDPParam`` (2.7 .. 2.15): a frozen fp32
    parameter under ``param_dtype=bf16``, ``reduce_dtype=fp32``."""

    def __init__(self) -> None:
        self.sharded_param = torch.zeros(1)  # requires_grad False: frozen
        self.mp_policy = None
        self.unsharded_grad_dtype = None
        self.may_reduce_grad_outside_dp = False

    def init_dtype_attrs(self, mp_policy: Any) -> None:
        self.orig_dtype, self.param_dtype, self.reduce_dtype = torch.float32, torch.bfloat16, torch.float32


def drops_frozen_group_dtypes(init_mp_dtypes: Callable[..., Any]) -> bool:
    """Whether ``init_mp_dtypes`` leaves an all-frozen group without a reduce dtype.

    Feature detection by behaviour: the method runs on a stand-in group of one frozen
    parameter (fp32, bf16 compute, fp32 reduce). torch 2.7 counts frozen parameters and
    2.14+ fall back to them (fp32: no bug); 2.8 .. 2.13 give ``None`` (the bug). Raises
    ``LookupError`` when the method does not run on the stand-in or sets no
    ``_reduce_dtype`` (internals changed); the caller then decides by version.
    """
    group = types.SimpleNamespace(fsdp_params=[_FrozenProbeParam()], mp_policy=None)
    try:
        init_mp_dtypes(group)
    except Exception as error:  # internals this stand-in does not model
        raise LookupError(f"{_METHOD} did not run on a stand-in group: {type(error).__name__}: {error}") from error
    resolved = getattr(group, "_reduce_dtype", _UNSET)
    if resolved is _UNSET:
        raise LookupError(f"{_METHOD} set no _reduce_dtype on a stand-in group")
    return resolved is None


def patch_fsdp_late_unfreeze_reduce_dtype() -> PatchResult:
    """Resolve the dtypes of all-frozen FSDP2 param groups like torch 2.14 does (bug I).

    Wraps the current ``FSDPParamGroup._init_mp_dtypes`` where it leaves an all-frozen
    group's reduce dtype ``None`` (``drops_frozen_group_dtypes``: torch 2.8 .. 2.13).
    Not applicable on torch 2.7 (frozen parameters count) and 2.14+ (fixed natively), or
    where the method is gone. If the stand-in cannot run, torch 2.8 <= version < 2.14
    decides.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(LATE_UNFREEZE_REDUCE_DTYPE, reason)
    group_cls = fsdp_param_group_class()
    current = getattr(group_cls, _METHOD, None)
    if group_cls is None or not callable(current):
        return not_applicable(LATE_UNFREEZE_REDUCE_DTYPE, f"FSDPParamGroup.{_METHOD} not found")
    if active_wrapper_in_chain(current, LATE_UNFREEZE_REDUCE_DTYPE):
        return already_installed(LATE_UNFREEZE_REDUCE_DTYPE)
    try:
        needed, how = drops_frozen_group_dtypes(current), "a frozen stand-in group"
    except LookupError as error:
        needed = torch_at_least(2, 8) and not torch_at_least(2, 14)
        how = f"torch version ({error})"
    if not needed:
        return not_applicable(
            LATE_UNFREEZE_REDUCE_DTYPE,
            f"{_METHOD} already gives an all-frozen group its parameters' dtypes (2.7 counts frozen "
            f"parameters; 2.14+ fall back to them, pytorch/pytorch#187376); decided by {how}",
        )
    wrapper = make_wrapper(current, LATE_UNFREEZE_REDUCE_DTYPE, resolve_frozen_group_dtypes)
    label = replace_attribute(group_cls, _METHOD, wrapper)
    return installed(LATE_UNFREEZE_REDUCE_DTYPE, f"wrapped {label}: an all-frozen group keeps no dtypes (decided by {how})")
