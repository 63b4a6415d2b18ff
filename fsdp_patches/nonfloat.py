"""Bug Q: ``fully_shard`` fails on a frozen non-float parameter (torch < 2.12).

pytorch/pytorch#177844. ``FSDPParam`` wraps each sharded parameter as
``nn.Parameter(sharded)``, which asks for ``requires_grad=True``, and only then copies the
original's flag; for ``uint8`` data (the packed weights of a quantized base) the first step
raises "only Tensors of floating point dtype can require gradients". 2.12 passes the flag
to the constructor.

``patch_fsdp_nonfloat_params`` wraps ``torch.distributed.fsdp.fully_shard``: while it runs, a
parameter made of non-float data is created with ``requires_grad=False`` (the only value
non-float data can have). Chosen by feature detection: not applicable where ``FSDPParam``
already creates the sharded parameter with the original's flag.

torch 2.7 then stops at the group's dtypes: ``FSDPParamGroup._init_mp_dtypes`` counts frozen
parameters too, "FSDP expects uniform original parameter dtype but got {torch.uint8,
torch.float32}" (2.8 counts only trainable ones, pytorch/pytorch#154103). Where its source
does not look at ``requires_grad``, the patch also wraps it so frozen non-float parameters
are left out of that resolution (frozen float parameters of another dtype still count).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ._compat import applicable, fsdp_param_class, fsdp_param_group_class
from ._wrapping import (
    PatchResult,
    active_wrapper_in_chain,
    already_installed,
    installed,
    make_wrapper,
    not_applicable,
    replace_attribute,
)

__all__ = ["patch_fsdp_nonfloat_params"]

NONFLOAT_PARAMS = "nonfloat_params"
_FIXED_TEXT = "requires_grad=param.requires_grad"


@contextlib.contextmanager
def _nonfloat_frozen() -> Iterator[None]:
    """``nn.Parameter(data)`` of non-float ``data`` does not require grad, for the block."""
    before = nn.Parameter.__dict__.get("__new__")
    original = nn.Parameter.__new__

    def new(cls: type, data: Any = None, requires_grad: bool = True) -> Any:
        if data is not None and not (torch.is_floating_point(data) or torch.is_complex(data)):
            requires_grad = False
        return original(cls, data, requires_grad)

    nn.Parameter.__new__ = staticmethod(new)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        if before is None:
            del nn.Parameter.__new__
        else:
            nn.Parameter.__new__ = before  # type: ignore[method-assign]


def _sharding_nonfloat(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with _nonfloat_frozen():
        return call(*args, **kwargs)


def _without_frozen_nonfloat(call: Callable[..., Any], group: Any, *args: Any, **kwargs: Any) -> Any:
    """``_init_mp_dtypes`` over the group's parameters other than frozen non-float ones."""
    params = group.fsdp_params
    kept = [p for p in params if p.sharded_param.requires_grad or p.sharded_param.is_floating_point()]
    if not kept or len(kept) == len(params):
        return call(group, *args, **kwargs)
    for fsdp_param in params:
        fsdp_param.init_dtype_attrs(group.mp_policy)
    group.fsdp_params = kept
    try:
        return call(group, *args, **kwargs)
    finally:
        group.fsdp_params = params


def _counts_frozen_params(method: Any) -> bool:
    try:
        return "requires_grad" not in inspect.getsource(method)
    except (OSError, TypeError):
        return False


def patch_fsdp_nonfloat_params() -> PatchResult:
    """Wrap ``fully_shard`` so a frozen non-float parameter can be sharded (bug Q)."""
    reason = applicable()
    if reason is not None:
        return not_applicable(NONFLOAT_PARAMS, reason)
    import torch.distributed.fsdp as fsdp

    init = getattr(fsdp_param_class(), "_init_sharded_param", None)
    try:
        fixed = init is not None and _FIXED_TEXT in inspect.getsource(init)
    except (OSError, TypeError):
        fixed = False
    if fixed:
        return not_applicable(NONFLOAT_PARAMS, "FSDPParam creates the sharded parameter with the original's requires_grad")
    current = getattr(fsdp, "fully_shard", None)
    if not callable(current):
        return not_applicable(NONFLOAT_PARAMS, "torch.distributed.fsdp.fully_shard not found")
    if active_wrapper_in_chain(current, NONFLOAT_PARAMS):
        return already_installed(NONFLOAT_PARAMS)
    labels = [replace_attribute(fsdp, "fully_shard", make_wrapper(current, NONFLOAT_PARAMS, _sharding_nonfloat))]
    group_cls = fsdp_param_group_class()
    init_dtypes = getattr(group_cls, "_init_mp_dtypes", None)
    if callable(init_dtypes) and _counts_frozen_params(init_dtypes) and not active_wrapper_in_chain(
            init_dtypes, NONFLOAT_PARAMS):
        wrapper = make_wrapper(init_dtypes, NONFLOAT_PARAMS, _without_frozen_nonfloat)
        labels.append(replace_attribute(group_cls, "_init_mp_dtypes", wrapper))
    return installed(NONFLOAT_PARAMS, f"wrapped {', '.join(labels)}")
