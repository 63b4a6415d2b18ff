"""Bug K: parameters of more than one dtype in one FSDP unit (LoRA adapters, fp32 routers).

FSDP2 puts every parameter one ``fully_shard`` call manages into one group and, at lazy
init (the first forward), raises "FSDP expects uniform original parameter dtype":
torch 2.7 over all of the group's parameters, 2.8 .. 2.15 over its trainable ones. So a
frozen bf16 base with trainable fp32 LoRA adapters fails on 2.7 only, and a trainable mix
(an fp32 router among bf16 weights, a LoRA base left trainable) fails on every release.
Stacks split units by dtype (NVIDIA-NeMo/Automodel#2655) or cast the whole model to one
dtype (huggingface/accelerate#3985).

* ``fully_shard_by_dtype(module, **kwargs)`` shards ``module`` so every unit holds one
  dtype: the sub-modules whose parameters are all of another dtype than the rest become,
  per dtype, one unit (``fully_shard([sub, ...])``), then ``module`` itself takes what is
  left. The dtype that stays is that of ``module``'s own parameters, else the one with
  the most elements. A container that is indexed, not called (PEFT keeps adapters in
  ``lora_A``/``lora_B`` module dicts), is looked into: its modules become the unit. A sub-module that holds two dtypes itself (not through children)
  cannot be split by module: ``ValueError`` names it.
* ``patch_fsdp_shard_by_dtype()`` wraps ``torch.distributed.fsdp.fully_shard`` so a call
  torch would reject (a trainable mix; on 2.7 any mix) is split as above. It reaches code
  that calls ``fully_shard`` through the module (``torch.distributed.fsdp.fully_shard``),
  not a name imported before the install.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ._compat import applicable, fsdp_module_class, fsdp_param_group_class, torch_at_least
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
    "fully_shard_by_dtype",
    "managed_params",
    "patch_fsdp_shard_by_dtype",
    "split_by_dtype",
]

SHARD_BY_DTYPE = "shard_by_dtype"
_CHECK_TEXT = "uniform original parameter dtype"


def _is_fsdp(module: nn.Module) -> bool:
    cls = fsdp_module_class()
    return cls is not None and isinstance(module, cls)


def managed_params(module: nn.Module, ignored: set[nn.Parameter] | frozenset = frozenset()) -> Iterator[nn.Parameter]:
    """The parameters a ``fully_shard(module)`` call would manage: ``module``'s and its
    sub-modules', except those under a module that is already FSDP and ``ignored`` ones."""
    seen: set[int] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        for p in m.parameters(recurse=False):
            if id(p) not in seen and p not in ignored:
                seen.add(id(p))
                yield p
        stack.extend(c for c in reversed(list(m.children())) if not _is_fsdp(c))


def _runs_forward(module: nn.Module) -> bool:
    """Whether ``module`` is called itself: FSDP2 gathers a unit in its modules' forward hooks, so a
    container that is only indexed (``nn.ModuleDict``, ``nn.ModuleList``: PEFT's ``lora_A["default"]``)
    would leave its unit sharded; the modules inside it are called."""
    return type(module).forward is not nn.Module.forward


def _dtypes(params: Iterator[nn.Parameter]) -> set[torch.dtype]:
    return {p.dtype for p in params}


def split_by_dtype(module: nn.Module, ignored: set[nn.Parameter] | frozenset = frozenset()) -> dict[torch.dtype, list[nn.Module]]:
    """The sub-modules to shard as their own units, by dtype (empty when ``module`` is uniform)."""
    every = list(managed_params(module, ignored))
    if len(_dtypes(iter(every))) <= 1:
        return {}
    own = _dtypes(p for p in module.parameters(recurse=False) if p not in ignored)
    if len(own) > 1:
        raise ValueError(f"fully_shard_by_dtype: {type(module).__name__} holds parameters of dtypes "
                         f"{sorted(map(str, own))} itself; FSDP units are modules, so split it into sub-modules")
    sizes: dict[torch.dtype, int] = {}
    for p in every:
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    keep = next(iter(own)) if own else max(sizes, key=lambda d: sizes[d])
    units: dict[torch.dtype, list[nn.Module]] = {}

    def visit(parent: nn.Module, path: str) -> None:
        for name, child in parent.named_children():
            if _is_fsdp(child):
                continue
            dtypes = _dtypes(managed_params(child, ignored))
            if not dtypes or dtypes == {keep}:
                continue
            direct = _dtypes(p for p in child.parameters(recurse=False) if p not in ignored)
            if len(dtypes) == 1 and _runs_forward(child):
                units.setdefault(next(iter(dtypes)), []).append(child)
                continue
            if not _runs_forward(child) and direct - {keep}:
                raise ValueError(f"fully_shard_by_dtype: {path}{name} ({type(child).__name__}) holds "
                                 f"{sorted(map(str, direct))} parameters itself but has no forward of its own; "
                                 f"FSDP units gather on forward, so give them a module that runs")
            if direct - {keep}:
                raise ValueError(f"fully_shard_by_dtype: {path}{name} holds {sorted(map(str, direct))} parameters "
                                 f"itself and other dtypes below it; FSDP units are modules, so split it")
            visit(child, f"{path}{name}.")

    visit(module, "")
    return units


def _shard_split(shard: Callable[..., Any], module: nn.Module, kwargs: dict[str, Any]) -> Any:
    for modules in split_by_dtype(module, set(kwargs.get("ignored_params") or ())).values():
        shard(modules if len(modules) > 1 else modules[0], **kwargs)
    return shard(module, **kwargs)


def fully_shard_by_dtype(module: nn.Module, **kwargs: Any) -> Any:
    """``fully_shard(module, **kwargs)`` with one unit per parameter dtype (see the module
    docstring); returns what ``fully_shard`` returns for ``module``."""
    import torch.distributed.fsdp as fsdp

    return _shard_split(fsdp.fully_shard, module, kwargs)


def _rejected_by_torch(module: nn.Module, ignored: set[nn.Parameter], counts_frozen: bool) -> bool:
    params = list(managed_params(module, ignored))
    checked = params if counts_frozen else [p for p in params if p.requires_grad]
    return len(_dtypes(iter(checked))) > 1


def _counts_frozen() -> bool:
    """Whether this torch's dtype check covers frozen parameters too (2.7; 2.8+ checks the
    trainable ones: the check's source names ``requires_grad``)."""
    try:
        source = inspect.getsource(fsdp_param_group_class()._init_mp_dtypes)  # type: ignore[union-attr]
    except (AttributeError, OSError, TypeError):
        return not torch_at_least(2, 8)
    return "requires_grad" not in source


def splitting(counts_frozen: bool) -> Callable[..., Any]:
    """The patch's behaviour around ``fully_shard``: split only what torch would reject."""

    def split_then_shard(call: Callable[..., Any], module: Any, *args: Any, **kwargs: Any) -> Any:
        if args or not isinstance(module, nn.Module):
            return call(module, *args, **kwargs)
        ignored = set(kwargs.get("ignored_params") or ())
        if not _rejected_by_torch(module, ignored, counts_frozen):
            return call(module, **kwargs)
        return _shard_split(call, module, kwargs)

    return split_then_shard


def patch_fsdp_shard_by_dtype() -> PatchResult:
    """Wrap ``torch.distributed.fsdp.fully_shard``: a module with parameters of several
    dtypes that torch would reject is sharded one unit per dtype (bug K).

    Not applicable where ``FSDPParamGroup`` no longer checks for a uniform dtype.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(SHARD_BY_DTYPE, reason)
    import torch.distributed.fsdp as fsdp

    group_cls = fsdp_param_group_class()
    check = getattr(group_cls, "_init_mp_dtypes", None)
    try:
        uniform_check = check is None or _CHECK_TEXT in inspect.getsource(check)
    except (OSError, TypeError):
        uniform_check = True
    if check is None or not uniform_check:
        return not_applicable(SHARD_BY_DTYPE, "FSDPParamGroup no longer asserts a uniform parameter dtype")
    current = getattr(fsdp, "fully_shard", None)
    if not callable(current):
        return not_applicable(SHARD_BY_DTYPE, "torch.distributed.fsdp.fully_shard not found")
    if active_wrapper_in_chain(current, SHARD_BY_DTYPE):
        return already_installed(SHARD_BY_DTYPE)
    # make_wrapper copies fully_shard's attributes (``fully_shard.state(module)`` keeps working)
    wrapper = make_wrapper(current, SHARD_BY_DTYPE, splitting(_counts_frozen()))
    return installed(SHARD_BY_DTYPE, f"wrapped {replace_attribute(fsdp, 'fully_shard', wrapper)}")
