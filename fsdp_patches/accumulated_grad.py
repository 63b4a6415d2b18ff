"""Bug C: a unit that never ran forward during a no-sync micro-batch.

A separately ``fully_shard``-ed sub-module that was never all-gathered (e.g. a vision
tower skipped on text-only batches) has no ``FSDPParam._unsharded_param`` yet. On a
no-sync micro-batch the root's final backward callback still calls its
``post_backward``, which calls ``FSDPParam.to_accumulated_grad_if_needed``; with a
``reduce_dtype`` that differs from ``param_dtype`` that method reads
``self._unsharded_param.grad`` unguarded and raises
``AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'``
(torch 2.7 .. 2.14; the method is gone in 2.15).

``patch_fsdp_accumulated_grad_guard`` swallows exactly that error: a param without an
unsharded param has no unsharded grad, so there is nothing to convert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._compat import applicable, fsdp_param_class
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
    "guard_missing_unsharded_param",
    "is_missing_unsharded_param_error",
    "patch_fsdp_accumulated_grad_guard",
]

ACCUMULATED_GRAD_GUARD = "accumulated_grad_guard"
_ATTR = "_unsharded_param"
_METHOD = "to_accumulated_grad_if_needed"


def is_missing_unsharded_param_error(fsdp_param: Any, error: BaseException) -> bool:
    """Whether ``error`` is exactly "``fsdp_param`` has no ``_unsharded_param``".

    True only for an ``AttributeError`` that names ``_unsharded_param`` (its ``name``
    where Python sets it, else its message), whose ``obj``, when set, is
    ``fsdp_param`` itself, and only while ``fsdp_param`` really lacks the attribute.
    """
    if not isinstance(error, AttributeError) or hasattr(fsdp_param, _ATTR):
        return False
    obj = getattr(error, "obj", None)
    if obj is not None and obj is not fsdp_param:
        return False
    name = getattr(error, "name", None)
    if name is not None:
        return name == _ATTR
    return f"'{_ATTR}'" in str(error)


def guard_missing_unsharded_param(method: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """The patch's behaviour around ``method`` (``to_accumulated_grad_if_needed``)."""
    try:
        return method(self, *args, **kwargs)
    except AttributeError as error:
        if is_missing_unsharded_param_error(self, error):
            return None
        raise


def patch_fsdp_accumulated_grad_guard() -> PatchResult:
    """Guard ``FSDPParam.to_accumulated_grad_if_needed`` (bug C).

    torch 2.7 .. 2.14: the method exists and reads ``_unsharded_param`` unguarded, so its
    current value is wrapped. torch 2.15: the method is gone (grad dtypes were
    redesigned), so nothing is installed and the result is not-applicable.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(ACCUMULATED_GRAD_GUARD, reason)
    param_cls = fsdp_param_class()
    current = getattr(param_cls, _METHOD, None)
    if param_cls is None or not callable(current):
        return not_applicable(ACCUMULATED_GRAD_GUARD, f"FSDPParam.{_METHOD} not found (removed in 2.15)")
    if active_wrapper_in_chain(current, ACCUMULATED_GRAD_GUARD):
        return already_installed(ACCUMULATED_GRAD_GUARD)
    wrapper = make_wrapper(current, ACCUMULATED_GRAD_GUARD, guard_missing_unsharded_param)
    return installed(ACCUMULATED_GRAD_GUARD, f"wrapped {replace_attribute(param_cls, _METHOD, wrapper)}")
