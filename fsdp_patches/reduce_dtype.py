"""Bug B: mixed gradient dtypes reach one reduce-scatter under accumulation.

With ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` and gradient
accumulation, ``post_backward`` hands ``foreach_reduce`` both grads accumulated over
no-sync micro-batches (already upcast to ``reduce_dtype``) and fresh grads or zero
fills (still ``param_dtype``). torch 2.7 .. 2.14 then assert "FSDP reduce-scatter
expects uniform gradient dtype but got {torch.bfloat16, torch.float32}". torch 2.15
redesigned grad dtypes and removed the assertion.

``patch_fsdp_uniform_reduce_dtype`` wraps ``foreach_reduce`` so a group of floating
grads with mixed dtypes is widened to their promoted (widest) dtype first. A uniform
group, or a mix that involves any non-floating dtype, is passed through unchanged so
the upstream assertion still catches real bugs (e.g. fp8 weights producing wrong
gradient dtypes).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._compat import (
    PatchResult,
    already_installed,
    applicable,
    foreach_reduce_aliases,
    installed,
    mark_wrapper,
    not_applicable,
    original_of,
    torch_at_least,
    wrapper_in_chain,
)

__all__ = [
    "patch_fsdp_uniform_reduce_dtype",
    "widen_float_grads_",
    "widest_float_dtype",
]

UNIFORM_REDUCE_DTYPE = "uniform_reduce_dtype"
_ASSERTION_TEXT = "uniform gradient dtype"
_GRADS_PARAMETER = "unsharded_grads"


def widest_float_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype | None:
    """The dtype to widen a group to, or ``None`` to leave it alone.

    ``None`` for a uniform group and for any mix containing a non-floating dtype.
    Otherwise ``torch.promote_types`` over the group: {bf16, fp32} -> fp32 and
    {bf16, fp16} -> fp32 (neither 16-bit type holds the other).
    """
    unique = set(dtypes)
    if len(unique) <= 1 or not all(d.is_floating_point for d in unique):
        return None
    return functools.reduce(torch.promote_types, unique)


def widen_float_grads_(grads: list[torch.Tensor]) -> torch.dtype | None:
    """Widen ``grads`` in place (list items replaced); return the new dtype or ``None``.

    In place, because ``foreach_reduce`` documents that its list owns the gradient
    references and clears it to free them: the narrow originals are released when
    replaced, not when the caller's frame ends.
    """
    target = widest_float_dtype(g.dtype for g in grads)
    if target is None:
        return None
    for i, grad in enumerate(grads):
        if grad.dtype != target:
            grads[i] = grad.to(target)
    assert all(g.dtype == target for g in grads)
    return target


def patch_fsdp_uniform_reduce_dtype() -> PatchResult:
    """Wrap every alias of ``foreach_reduce`` with ``widen_float_grads_`` (bug B).

    Aliases are found by identity in all imported torch FSDP modules (2.7 .. 2.15:
    ``_fsdp_collectives.foreach_reduce`` and the name ``_fsdp_param_group`` imports).
    The grads are the ``unsharded_grads`` parameter, second positional in every
    release 2.7 .. 2.15; it is located by name through ``inspect.signature``.

    Not applicable where the "uniform gradient dtype" assertion is not in the source
    of ``foreach_reduce`` (2.15+); if the source cannot be read, torch < 2.15 decides.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(UNIFORM_REDUCE_DTYPE, reason)
    aliases = foreach_reduce_aliases()
    if not aliases:
        return not_applicable(UNIFORM_REDUCE_DTYPE, "_fsdp_collectives.foreach_reduce not found")
    original = original_of(getattr(*aliases[0]))
    if not _asserts_uniform_dtype(original):
        return not_applicable(
            UNIFORM_REDUCE_DTYPE, "foreach_reduce has no uniform-gradient-dtype assertion (fixed natively)"
        )
    if all(wrapper_in_chain(getattr(m, a), UNIFORM_REDUCE_DTYPE) for m, a in aliases):
        return already_installed(UNIFORM_REDUCE_DTYPE)
    wrapper = _make_widening_wrapper(original)
    wrapped: list[str] = []
    for module, attr in aliases:
        if not wrapper_in_chain(getattr(module, attr), UNIFORM_REDUCE_DTYPE):
            setattr(module, attr, wrapper)
            wrapped.append(f"{module.__name__.rsplit('.', 1)[-1]}.{attr}")
    return installed(UNIFORM_REDUCE_DTYPE, "wrapped " + ", ".join(wrapped))


def _asserts_uniform_dtype(fn: Callable[..., Any]) -> bool:
    try:
        return _ASSERTION_TEXT in inspect.getsource(fn)
    except (OSError, TypeError):
        return not torch_at_least(2, 15)


def _grads_position(fn: Callable[..., Any]) -> int:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 1
    return names.index(_GRADS_PARAMETER) if _GRADS_PARAMETER in names else 1


def _make_widening_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    position = _grads_position(original)

    @functools.wraps(original)
    def foreach_reduce(*args: Any, **kwargs: Any) -> Any:
        if _GRADS_PARAMETER in kwargs:
            grads = kwargs[_GRADS_PARAMETER]
        else:
            grads = args[position] if len(args) > position else None
        if isinstance(grads, list) and grads:
            widen_float_grads_(grads)
        return original(*args, **kwargs)

    mark_wrapper(foreach_reduce, original, UNIFORM_REDUCE_DTYPE)
    return foreach_reduce
