"""Version and feature detection shared by the FSDP2 patches (torch 2.7 .. 2.15).

Everything here reads torch's private FSDP2 internals defensively. In every supported
release they live in ``torch.distributed.fsdp._fully_shard`` (``torch.distributed.
_composable.fsdp`` only re-exports the public API), and the public ``FSDPModule`` is in
``torch.distributed.fsdp``. What differs between releases: ``FSDPState`` switched from
one ``_fsdp_param_group`` to a list ``_fsdp_param_groups`` in 2.12.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

__all__ = [
    "applicable",
    "fsdp_internal_module",
    "fsdp_module_class",
    "fsdp_param_class",
    "fsdp_param_group_class",
    "iter_param_groups",
    "param_groups_of_module",
    "param_groups_of_state",
    "torch_at_least",
    "torch_version",
]

#: Where the FSDP2 internals live in torch 2.7 .. 2.15.
INTERNAL_PACKAGE = "torch.distributed.fsdp._fully_shard"


# --------------------------------------------------------------------------- versions


def torch_version() -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the running torch; local tags (``+cpu``) ignored."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.__version__)
    if match is None:
        raise RuntimeError(f"cannot read a release from torch.__version__ {torch.__version__!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def torch_at_least(major: int, minor: int, patch: int = 0) -> bool:
    """Version fallback for the rare decision that no feature check can make."""
    return torch_version() >= (major, minor, patch)


# ------------------------------------------------------------------ internal modules


def applicable() -> str | None:
    """``None`` when FSDP2 can be patched at all, else the reason it cannot."""
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this build"
    if fsdp_internal_module("_fsdp_param_group") is None:
        return "FSDP2 internals (_fsdp_param_group) not found"
    return None


@functools.cache
def fsdp_internal_module(name: str) -> ModuleType | None:
    """Import ``_fsdp_param``, ``_fsdp_param_group``, ``_fsdp_collectives`` or
    ``_fsdp_state`` from ``torch.distributed.fsdp._fully_shard``; ``None`` if absent."""
    if not torch.distributed.is_available():
        return None
    try:
        return importlib.import_module(f"{INTERNAL_PACKAGE}.{name}")
    except ImportError:
        return None


def fsdp_param_group_class() -> type | None:
    module = fsdp_internal_module("_fsdp_param_group")
    return getattr(module, "FSDPParamGroup", None)


def fsdp_param_class() -> type | None:
    module = fsdp_internal_module("_fsdp_param")
    return getattr(module, "FSDPParam", None)


def fsdp_module_class() -> type | None:
    """The public ``torch.distributed.fsdp.FSDPModule``."""
    if not torch.distributed.is_available():
        return None
    try:
        return getattr(importlib.import_module("torch.distributed.fsdp"), "FSDPModule", None)
    except ImportError:
        return None


# ------------------------------------------------------------------- param groups


def param_groups_of_state(state: Any) -> list[Any]:
    """The ``FSDPParamGroup``s of one ``FSDPState``.

    2.12+ keeps a list ``_fsdp_param_groups``; 2.7 .. 2.11 keep one optional
    ``_fsdp_param_group`` (``None`` for a module without direct parameters).
    """
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return [g for g in groups if g is not None]
    group = getattr(state, "_fsdp_param_group", None)
    return [group] if group is not None else []


def param_groups_of_module(module: nn.Module) -> list[Any]:
    """The param groups of one ``fully_shard``-ed module (empty for other modules)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    return param_groups_of_state(get_state())


def iter_param_groups(root: nn.Module) -> Iterator[Any]:
    """Every param group of every FSDP module under (and including) ``root``."""
    for module in root.modules():
        yield from param_groups_of_module(module)
