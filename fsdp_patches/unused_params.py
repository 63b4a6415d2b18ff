"""Bugs A and E: parameters that some (A) or all (E) ranks did not use in backward.

A. FSDP2 reduce-scatters only the parameters that have a gradient on the local rank.
   When ranks use different parameters (conditional branches, MoE, multi-modal
   batches), ranks reduce-scatter different sets and sizes: gloo aborts with
   "Received data size doesn't match expected size", NCCL hangs or corrupts data.
   ``patch_fsdp_unused_param_reduction`` makes every rank reduce every parameter that
   requires grad, zero-filling the unused ones.

E. With A fixed, a parameter that *no* rank used ends with a zero gradient instead of
   ``None``; AdamW then applies weight decay and residual momentum to it and creates
   optimizer state for it. ``patch_fsdp_restore_unused_param_grads`` decides
   collectively which parameters no rank used in the whole accumulation window and
   gives them back the ``None`` gradient they would have had.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ._compat import applicable, fsdp_module_class, fsdp_param_group_class
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
    "patch_fsdp_restore_unused_param_grads",
    "patch_fsdp_unused_param_reduction",
]

UNUSED_PARAM_REDUCTION = "unused_param_reduction"
RESTORE_UNUSED_PARAM_GRADS = "restore_unused_param_grads"

#: On an ``FSDPParam``: the zero grad our pre-2.13 fill put on its unsharded param
#: during the current ``post_backward`` call (lets E tell a fill from a real grad).
_ZERO_FILL_ATTR = "_fsdp_compat_zero_fill"
#: On an ``FSDPParam``: True once it had a local grad in the current window.
_USED_ATTR = "_fsdp_compat_used_in_window"
#: On an ``FSDPParamGroup`` (2.13+): the per-group flag the public setter writes.
_FLAG = "reduce_scatter_unused_params"


# ============================================================================ bug A


def patch_fsdp_unused_param_reduction() -> PatchResult:
    """Make FSDP2 reduce-scatter unused parameters by default (bug A).

    * torch >= 2.13 (``FSDPModule.set_reduce_scatter_unused_params`` exists): the
      per-param-group flag that the public setter writes,
      ``FSDPParamGroup.reduce_scatter_unused_params``, is turned on when each group is
      constructed (wrapped ``FSDPParamGroup.__init__``). Torch's own ``post_backward``
      then zero-fills exactly as it does after the public call. The constructor is the
      hook because it is the single place every group (``fully_shard`` on any module,
      any number of groups per state) passes through, it does not depend on the
      lazy-init internals that moved between releases, and it only changes the
      *default*: a later ``module.set_reduce_scatter_unused_params(False)`` still wins.
      Groups constructed before the install are not touched, so install first; an
      undo likewise leaves the flag on in groups constructed while it was installed.
    * torch 2.7 .. 2.12 (no public setter): ``FSDPParamGroup.post_backward`` is wrapped
      to zero-fill, on a reducing backward, every parameter that requires grad but has
      neither a local grad nor an accumulated grad (see ``_zero_fill_unused_grads``).
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(UNUSED_PARAM_REDUCTION, reason)
    group_cls = fsdp_param_group_class()
    if group_cls is None:
        return not_applicable(UNUSED_PARAM_REDUCTION, "FSDPParamGroup not found")
    module_cls = fsdp_module_class()
    if module_cls is not None and hasattr(module_cls, "set_reduce_scatter_unused_params"):
        return _install_default_on(group_cls)
    if callable(getattr(group_cls, "post_backward", None)):
        return _install_zero_fill(group_cls)
    return not_applicable(UNUSED_PARAM_REDUCTION, "FSDPParamGroup.post_backward not found")


def _install_default_on(group_cls: type) -> PatchResult:
    """torch >= 2.13: wrap ``FSDPParamGroup.__init__`` to default the public flag on."""
    current = group_cls.__dict__.get("__init__")
    if current is None:
        return not_applicable(UNUSED_PARAM_REDUCTION, "FSDPParamGroup.__init__ not found")
    if active_wrapper_in_chain(current, UNUSED_PARAM_REDUCTION):
        return already_installed(UNUSED_PARAM_REDUCTION)
    replace_attribute(group_cls, "__init__", make_wrapper(current, UNUSED_PARAM_REDUCTION, _init_flag_on))
    return installed(
        UNUSED_PARAM_REDUCTION,
        "public set_reduce_scatter_unused_params exists: defaulted on in FSDPParamGroup.__init__",
    )


def _init_flag_on(init: Callable[..., None], self: Any, *args: Any, **kwargs: Any) -> None:
    """Around ``FSDPParamGroup.__init__``: construct, then default the public flag on."""
    init(self, *args, **kwargs)
    if not hasattr(self, _FLAG):
        raise RuntimeError(
            f"fsdp_patches {UNUSED_PARAM_REDUCTION}: FSDPParamGroup.__init__ no longer sets {_FLAG}; "
            "this torch needs a new version of the patch (undo it, or set the flag per module "
            "with set_reduce_scatter_unused_params)"
        )
    self.reduce_scatter_unused_params = True


def _install_zero_fill(group_cls: type) -> PatchResult:
    """torch < 2.13: wrap ``FSDPParamGroup.post_backward`` with a zero fill."""
    current = group_cls.post_backward  # type: ignore[attr-defined]
    if active_wrapper_in_chain(current, UNUSED_PARAM_REDUCTION):
        return already_installed(UNUSED_PARAM_REDUCTION)
    replace_attribute(group_cls, "post_backward", make_wrapper(current, UNUSED_PARAM_REDUCTION, _zero_fill_around))
    return installed(
        UNUSED_PARAM_REDUCTION,
        "no public set_reduce_scatter_unused_params: zero-fill in FSDPParamGroup.post_backward",
    )


def _zero_fill_around(post_backward: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """Around ``FSDPParamGroup.post_backward`` before 2.13: zero-fill, reduce, forget the fills."""
    filled = _zero_fill_unused_grads(self) if getattr(self, "reduce_grads", True) else []
    try:
        return post_backward(self, *args, **kwargs)
    finally:
        for fsdp_param in filled:
            vars(fsdp_param).pop(_ZERO_FILL_ATTR, None)


def _zero_fill_unused_grads(group: Any) -> list[Any]:
    """Give every unused parameter of ``group`` a zero local grad; return those filled.

    Mirrors how ``post_backward`` picks what to reduce in 2.7 .. 2.12: a param takes
    part only if it has ``_unsharded_param`` (absent until its first all-gather) and
    then its ``unsharded_accumulated_grad`` (set by earlier no-sync micro-batches when
    ``reduce_dtype`` differs) or else ``unsharded_param.grad``. A param with neither
    that requires grad gets ``zeros_like(unsharded_param)`` (the unsharded param's
    dtype, a DTensor for a DTensor param) so every rank reduce-scatters the same set.
    """
    filled: list[Any] = []
    for fsdp_param in group.fsdp_params:
        unsharded = getattr(fsdp_param, "_unsharded_param", None)
        if unsharded is None or not unsharded.requires_grad:
            continue
        if unsharded.grad is not None:
            continue
        if getattr(fsdp_param, "unsharded_accumulated_grad", None) is not None:
            continue
        zero = torch.zeros_like(unsharded)
        unsharded.grad = zero
        setattr(fsdp_param, _ZERO_FILL_ATTR, zero)
        filled.append(fsdp_param)
    return filled


# ============================================================================ bug E


def patch_fsdp_restore_unused_param_grads() -> PatchResult:
    """Give parameters that no rank used in an accumulation window a ``None`` grad (E).

    Wraps ``FSDPParamGroup.post_backward`` (all versions 2.7 .. 2.15; on 2.13+ around
    torch's native zero fill, before 2.13 around or under the A wrapper, either order):

    1. On entry of every call, each ``FSDPParam`` that has a local grad (a real
       ``unsharded_param.grad`` or an ``unsharded_accumulated_grad``; never a zero fill
       of ours) is marked used for the current window. Usage is grad presence, never a
       zero value.
    2. On the call that assigns the sharded grads (``reduce_grads`` true and, under
       HSDP/replicate, ``all_reduce_grads`` true; a deferred HSDP all-reduce keeps the
       window open) the used flags are OR-reduced (``MAX`` all-reduce of a small int
       tensor on the group's device) over the shard and then the replicate process group,
       so every rank of the reduction domain gets the same answer, and the flags reset.
    3. After torch's ``post_backward`` returns, a parameter no rank used whose sharded
       grad was ``None`` before the reduction gets ``None`` back. A sharded grad that
       existed before (no ``zero_grad`` between steps, or ``set_to_none=False``) is left
       as it was: the reduction added zeros to it, and dropping it would lose earlier
       windows' gradients.

    The collective is skipped on a group without any materialized unsharded param
    that requires grad (identical on all ranks, since all-gathers are collective).
    Without A (or the public setter) installed, nothing is zero-filled and step 3 finds
    nothing to undo: harmless. ``post_accumulate_grad`` hooks on the sharded params see
    the zero grad before it is dropped.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(RESTORE_UNUSED_PARAM_GRADS, reason)
    group_cls = fsdp_param_group_class()
    current = getattr(group_cls, "post_backward", None)
    if group_cls is None or not callable(current):
        return not_applicable(RESTORE_UNUSED_PARAM_GRADS, "FSDPParamGroup.post_backward not found")
    if active_wrapper_in_chain(current, RESTORE_UNUSED_PARAM_GRADS):
        return already_installed(RESTORE_UNUSED_PARAM_GRADS)
    wrapper = make_wrapper(current, RESTORE_UNUSED_PARAM_GRADS, _restore_around)
    return installed(RESTORE_UNUSED_PARAM_GRADS, f"wrapped {replace_attribute(group_cls, 'post_backward', wrapper)}")


def _restore_around(post_backward: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """Around ``FSDPParamGroup.post_backward``: steps 1 .. 3 of bug E's patch."""
    fsdp_params = list(self.fsdp_params)
    for fsdp_param in fsdp_params:
        if _has_local_grad(fsdp_param):
            setattr(fsdp_param, _USED_ATTR, True)
    if not _closes_window(self) or not _has_materialized_param(fsdp_params):
        return post_backward(self, *args, **kwargs)
    local_used = [bool(vars(p).pop(_USED_ATTR, False)) for p in fsdp_params]
    grad_was_none = [p.sharded_param.grad is None for p in fsdp_params]
    used = _or_over_reduction_domain(self, local_used)
    result = post_backward(self, *args, **kwargs)
    for fsdp_param, was_used, was_none in zip(fsdp_params, used, grad_was_none):
        if not was_used and was_none and fsdp_param.sharded_param.grad is not None:
            fsdp_param.sharded_param.grad = None
    return result


def _has_local_grad(fsdp_param: Any) -> bool:
    """Whether this rank produced a grad for ``fsdp_param`` (zero fills excluded).

    2.7 .. 2.14: a grad is in ``unsharded_param.grad`` or, after a no-sync micro-batch
    with a different ``reduce_dtype``, in ``unsharded_accumulated_grad``. 2.15: only
    ``unsharded_param.grad`` (the property aliases it).
    """
    unsharded = getattr(fsdp_param, "_unsharded_param", None)
    if unsharded is None:
        return False
    grad = unsharded.grad
    if grad is not None and grad is not vars(fsdp_param).get(_ZERO_FILL_ATTR):
        return True
    return getattr(fsdp_param, "unsharded_accumulated_grad", None) is not None


def _has_materialized_param(fsdp_params: list[Any]) -> bool:
    return any(
        getattr(p, "_unsharded_param", None) is not None and p.sharded_param.requires_grad
        for p in fsdp_params
    )


def _closes_window(group: Any) -> bool:
    """Whether this ``post_backward`` assigns sharded grads (2.7 .. 2.15).

    ``reduce_grads`` false (``set_requires_gradient_sync(False)``) only accumulates.
    Under HSDP or replicate (mesh info with a ``replicate_process_group``),
    ``all_reduce_grads`` false (``set_requires_all_reduce(False)``) reduce-scatters but
    keeps the result pending until a later backward, which is when grads are assigned.
    """
    if not getattr(group, "reduce_grads", True):
        return False
    if getattr(group.mesh_info, "replicate_process_group", None) is not None:
        return bool(getattr(group, "all_reduce_grads", True))
    return True


def _or_over_reduction_domain(group: Any, flags: list[bool]) -> list[bool]:
    """Element-wise OR of ``flags`` over the group's shard and replicate groups."""
    process_groups = [
        getattr(group.mesh_info, "shard_process_group", None),
        getattr(group.mesh_info, "replicate_process_group", None),
    ]
    process_groups = [pg for pg in process_groups if pg is not None and pg.size() > 1]
    if not process_groups:
        return flags
    tensor = torch.tensor(flags, dtype=torch.int32, device=group.device)
    for pg in process_groups:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=pg)
    return [bool(v) for v in tensor.tolist()]
