"""Version and feature detection shared by the FSDP2 patches.

Everything here reads torch's private FSDP2 internals defensively: the modules moved
(``torch.distributed._composable.fsdp`` before 2.6, ``torch.distributed.fsdp._fully_shard``
since), ``FSDPState`` switched from one ``_fsdp_param_group`` to a list
``_fsdp_param_groups`` in 2.12, and ``foreach_reduce`` is imported by name into
``_fsdp_param_group`` so it has more than one module-level alias.

The wrapper helpers implement the idempotence rule of every patch: a wrapper carries
``PATCH_MARKER`` (the patch's short name) and ``__wrapped__`` (what it wraps), so an
install can walk the chain of this project's wrappers, see whether its own is already
there, and reach the untouched torch function at the bottom exactly once.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

__all__ = [
    "PATCH_MARKER",
    "PatchResult",
    "already_installed",
    "applicable",
    "fsdp_internal_module",
    "fsdp_module_class",
    "fsdp_param_class",
    "fsdp_param_group_class",
    "foreach_reduce_aliases",
    "installed",
    "iter_param_groups",
    "mark_wrapper",
    "not_applicable",
    "original_of",
    "param_groups_of_module",
    "param_groups_of_state",
    "torch_at_least",
    "torch_version",
    "wrapper_in_chain",
]

#: Attribute set on every wrapper this project installs; its value is the patch name.
PATCH_MARKER = "__fsdp_compat_patch__"

#: Where the FSDP2 internals live, newest layout first.
_INTERNAL_PACKAGES = (
    "torch.distributed.fsdp._fully_shard",  # 2.6+
    "torch.distributed._composable.fsdp",  # up to 2.5
)

#: Module-name prefixes scanned for aliases of ``foreach_reduce``.
_ALIAS_PREFIXES = ("torch.distributed.fsdp", "torch.distributed._composable")


@dataclass(frozen=True)
class PatchResult:
    """Outcome of one install call."""

    name: str
    status: str  # "installed" | "already-installed" | "not-applicable"
    reason: str


def installed(name: str, reason: str) -> PatchResult:
    return PatchResult(name=name, status="installed", reason=reason)


def already_installed(name: str, reason: str = "wrapper already present") -> PatchResult:
    return PatchResult(name=name, status="already-installed", reason=reason)


def not_applicable(name: str, reason: str) -> PatchResult:
    return PatchResult(name=name, status="not-applicable", reason=reason)


# --------------------------------------------------------------------------- versions


def torch_version() -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the running torch; local tags (``+cpu``) ignored."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.__version__)
    assert match is not None, f"unparsable torch version {torch.__version__!r}"
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
    ``_fsdp_state`` from whichever package holds them in this torch (2.6+:
    ``torch.distributed.fsdp._fully_shard``; older: ``torch.distributed._composable.fsdp``).
    """
    if not torch.distributed.is_available():
        return None
    for package in _INTERNAL_PACKAGES:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ImportError:
            continue
    return None


def fsdp_param_group_class() -> type | None:
    module = fsdp_internal_module("_fsdp_param_group")
    return getattr(module, "FSDPParamGroup", None)


def fsdp_param_class() -> type | None:
    module = fsdp_internal_module("_fsdp_param")
    return getattr(module, "FSDPParam", None)


def fsdp_module_class() -> type | None:
    """The public ``FSDPModule`` (``torch.distributed.fsdp`` since 2.6)."""
    if not torch.distributed.is_available():
        return None
    for package in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            cls = getattr(importlib.import_module(package), "FSDPModule", None)
        except ImportError:
            continue
        if cls is not None:
            return cls
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


# ----------------------------------------------------------------------- wrappers


def mark_wrapper(wrapper: Callable[..., Any], original: Callable[..., Any], patch: str) -> None:
    """Tag ``wrapper`` as this project's wrapper of ``original`` for patch ``patch``."""
    setattr(wrapper, PATCH_MARKER, patch)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]


def _marker(obj: Any) -> str | None:
    """``obj``'s patch marker; ``None`` also for objects whose ``getattr`` misbehaves."""
    try:
        return getattr(obj, PATCH_MARKER, None)
    except Exception:
        return None


def _chain(obj: Any) -> Iterator[Any]:
    """``obj`` and everything below it through this project's wrappers."""
    while True:
        yield obj
        if _marker(obj) is None:
            return
        obj = obj.__wrapped__


def wrapper_in_chain(obj: Any, patch: str) -> bool:
    """Whether a wrapper of ``patch`` is anywhere in ``obj``'s chain of our wrappers."""
    return any(_marker(link) == patch for link in _chain(obj))


def original_of(obj: Any) -> Any:
    """The torch object at the bottom of ``obj``'s chain of our wrappers."""
    for link in _chain(obj):
        bottom = link
    return bottom


# ---------------------------------------------------------------- foreach_reduce


def foreach_reduce_aliases() -> list[tuple[ModuleType, str]]:
    """Every ``(module, attribute)`` under torch's FSDP packages that holds
    ``foreach_reduce`` (the torch function or one of our wrappers of it).

    ``_fsdp_param_group`` does ``from ._fsdp_collectives import foreach_reduce``, so
    wrapping only ``_fsdp_collectives`` changes nothing that ``post_backward`` calls.
    Scanning by identity finds every such alias in the imported FSDP modules of any
    version. Empty if ``_fsdp_collectives`` has no ``foreach_reduce``.
    """
    for name in ("_fsdp_param_group", "_fsdp_state", "_fsdp_param"):
        fsdp_internal_module(name)  # make sure the usual importers are loaded
    collectives = fsdp_internal_module("_fsdp_collectives")
    canonical = getattr(collectives, "foreach_reduce", None)
    if canonical is None:
        return []
    target = original_of(canonical)
    aliases: list[tuple[ModuleType, str]] = []
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not module_name.startswith(_ALIAS_PREFIXES):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and original_of(value) is target:
                aliases.append((module, attr))
    assert (collectives, "foreach_reduce") in aliases
    return aliases
