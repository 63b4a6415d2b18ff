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
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch

from ._compat import applicable, fsdp_internal_module, torch_at_least
from ._wrapping import (
    Around,
    PatchResult,
    active_wrapper_in_chain,
    already_installed,
    chain,
    installed,
    make_wrapper,
    not_applicable,
    replace_attribute,
)

__all__ = [
    "foreach_reduce_aliases",
    "patch_fsdp_uniform_reduce_dtype",
    "widen_float_grads_",
    "widening",
    "widest_float_dtype",
]

UNIFORM_REDUCE_DTYPE = "uniform_reduce_dtype"
_ASSERTION_TEXT = "uniform gradient dtype"
_GRADS_PARAMETER = "unsharded_grads"
_NAME = "foreach_reduce"
#: Modules scanned for aliases of ``foreach_reduce``.
_ALIAS_PREFIX = "torch.distributed.fsdp"


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
    return target


def widening(position: int) -> Around:
    """The patch's behaviour around a ``foreach_reduce`` whose grads list is the
    ``unsharded_grads`` keyword or else the positional argument at ``position``."""

    def widen_then_reduce(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _GRADS_PARAMETER in kwargs:
            grads = kwargs[_GRADS_PARAMETER]
        else:
            grads = args[position] if len(args) > position else None
        if isinstance(grads, list) and grads:
            widen_float_grads_(grads)
        return call(*args, **kwargs)

    return widen_then_reduce


def patch_fsdp_uniform_reduce_dtype() -> PatchResult:
    """Wrap every alias of ``foreach_reduce`` with ``widen_float_grads_`` (bug B).

    Each alias (see ``foreach_reduce_aliases``) gets a wrapper of its current value, so
    a wrapper that other code put there first still runs. The grads are the
    ``unsharded_grads`` parameter, second positional in every release 2.7 .. 2.15; it
    is located by name through ``inspect.signature`` of torch's function.

    Not applicable where the "uniform gradient dtype" assertion is not in the source
    of torch's ``foreach_reduce`` (2.15+); if the source cannot be read, torch < 2.15
    decides.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(UNIFORM_REDUCE_DTYPE, reason)
    aliases = foreach_reduce_aliases()
    if not aliases:
        return not_applicable(UNIFORM_REDUCE_DTYPE, "_fsdp_collectives.foreach_reduce not found")
    collectives = aliases[0][0]
    torch_fn = _torch_function(getattr(collectives, _NAME), collectives)
    if not _asserts_uniform_dtype(torch_fn if torch_fn is not None else collectives):
        return not_applicable(
            UNIFORM_REDUCE_DTYPE, "foreach_reduce has no uniform-gradient-dtype assertion (fixed natively)"
        )
    around = widening(_grads_position(torch_fn))
    wrappers: dict[int, Callable[..., Any]] = {}  # one wrapper per distinct current value
    wrapped: list[str] = []
    for module, attr in aliases:
        current = getattr(module, attr)
        if active_wrapper_in_chain(current, UNIFORM_REDUCE_DTYPE):
            continue
        if id(current) not in wrappers:
            wrappers[id(current)] = make_wrapper(current, UNIFORM_REDUCE_DTYPE, around)
        wrapped.append(replace_attribute(module, attr, wrappers[id(current)]))
    if not wrapped:
        return already_installed(UNIFORM_REDUCE_DTYPE)
    return installed(UNIFORM_REDUCE_DTYPE, "wrapped " + ", ".join(wrapped))


def foreach_reduce_aliases() -> list[tuple[ModuleType, str]]:
    """Every ``(module, attribute)`` under ``torch.distributed.fsdp`` through which
    ``foreach_reduce`` is called; ``_fsdp_collectives.foreach_reduce`` first.

    ``_fsdp_param_group`` does ``from ._fsdp_collectives import foreach_reduce``, so
    wrapping only ``_fsdp_collectives`` changes nothing that ``post_backward`` calls.
    An attribute counts when it is named ``foreach_reduce`` or when its ``__wrapped__``
    chain ends at the same function as ``_fsdp_collectives.foreach_reduce``'s (torch's,
    under anyone's wrappers). Empty if ``_fsdp_collectives`` has no ``foreach_reduce``.
    """
    for name in ("_fsdp_param_group", "_fsdp_state", "_fsdp_param"):
        fsdp_internal_module(name)  # make sure the usual importers are loaded
    collectives = fsdp_internal_module("_fsdp_collectives")
    canonical = getattr(collectives, _NAME, None)
    if collectives is None or not callable(canonical):
        return []
    bottom = _bottom(canonical)
    aliases = [(collectives, _NAME)]
    for module_name, module in sorted(sys.modules.items()):
        if module is None or module is collectives or not module_name.startswith(_ALIAS_PREFIX):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and (attr == _NAME or _bottom(value) is bottom):
                aliases.append((module, attr))
    return aliases


def _bottom(obj: Any) -> Any:
    for link in chain(obj):
        bottom = link
    return bottom


def _torch_function(obj: Any, collectives: ModuleType) -> Callable[..., Any] | None:
    """Torch's own ``foreach_reduce`` in ``obj``'s chain (``None``: a wrapper hides it)."""
    for link in chain(obj):
        if getattr(link, "__module__", None) == collectives.__name__ and getattr(link, "__name__", None) == _NAME:
            return link
    return None


def _asserts_uniform_dtype(source_of: Any) -> bool:
    try:
        return _ASSERTION_TEXT in inspect.getsource(source_of)
    except (OSError, TypeError):
        return not torch_at_least(2, 15)


def _grads_position(fn: Callable[..., Any] | None) -> int:
    try:
        names = list(inspect.signature(fn).parameters) if fn is not None else []
    except (TypeError, ValueError):
        names = []
    return names.index(_GRADS_PARAMETER) if _GRADS_PARAMETER in names else 1
