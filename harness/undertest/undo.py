"""Undo process-global monkeypatches, so one launch can run several patch sets in turn.

A patches module installs by assigning attributes: functions on torch's modules
(``foreach_reduce``) and methods on its classes (``FSDPParamGroup.post_backward``).
``PatchUndo`` records every attribute of the torch modules a patch may touch, and of
the classes they define, and puts them back; the patches module itself is imported afresh
for each patch set, so its own "already installed" state starts clean too.

Scope: modules under ``torch.distributed``, ``torch.nn.utils`` and ``torch.optim``.
A patch that changes anything else (C++ state, other packages) is not undone; give such
a module a launch of its own (``--isolate process``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["SCOPES", "PatchUndo", "forget_module", "preload"]

SCOPES = ("torch.distributed", "torch.nn.utils", "torch.optim")
_MISSING = object()


@dataclass
class PatchUndo:
    """Attributes of in-scope modules and their classes, as they were at ``take()``."""

    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    classes: list[tuple[type, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def take(cls) -> PatchUndo:
        preload()
        snap = cls()
        seen: set[int] = set()
        for name, module in list(sys.modules.items()):
            if not isinstance(module, ModuleType) or not _in_scope(name):
                continue
            attrs = dict(vars(module))
            snap.modules[name] = attrs
            for value in attrs.values():
                if isinstance(value, type) and _in_scope(getattr(value, "__module__", "") or "") and id(value) not in seen:
                    seen.add(id(value))
                    snap.classes.append((value, dict(vars(value))))
        return snap

    def _targets(self):
        """(label, object, attributes at snapshot time) for every module and class held."""
        for name, attrs in self.modules.items():
            module = sys.modules.get(name)
            if module is not None:
                yield name, module, attrs
        for klass, attrs in self.classes:
            yield klass.__qualname__, klass, attrs

    def changes(self) -> list[str]:
        """Names whose value differs from the snapshot (what ``restore`` would undo)."""
        out = []
        for label, obj, attrs in self._targets():
            now = vars(obj)
            out += [f"{label}.{k}" for k, v in attrs.items() if now.get(k, _MISSING) is not v]
            out += [f"{label}.{k}" for k in now.keys() - attrs.keys()]
        return out

    def restore(self) -> None:
        for _, obj, attrs in self._targets():
            now = vars(obj)
            for k in list(now.keys() - attrs.keys()):
                delattr(obj, k)
            for k, v in attrs.items():
                if now.get(k, _MISSING) is not v:
                    setattr(obj, k, v)


def forget_module(spec: str) -> None:
    """Drop a patches module (and its submodules) from ``sys.modules`` so it imports afresh."""
    for name in list(sys.modules):
        if name == spec or name.startswith(spec + ".") or name.startswith("_fsdp_compat_patches_"):
            del sys.modules[name]


#: Imported before a snapshot, so a patch cannot change a module the snapshot missed.
PRELOAD = (
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed._composable.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.device_mesh",
    "torch.nn.utils",
    "torch.optim",
)


def preload() -> None:
    """Import every module a patch may touch (and that FSDP2 imports lazily on first use:
    dynamo), so snapshots see them and the first cell of a launch does not pay for it."""
    import importlib
    import pkgutil

    global _PRELOADED
    if _PRELOADED:
        return
    importlib.import_module("torch._dynamo")  # the package only: fully_shard imports it on first use
    for name in PRELOAD:
        try:
            package = importlib.import_module(name)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(getattr(package, "__path__", []) or []):
            try:
                importlib.import_module(f"{name}.{info.name}")
            except Exception:  # optional pieces (e.g. needing an accelerator) may fail to import
                continue
    _PRELOADED = True


_PRELOADED = False


def _in_scope(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in SCOPES)
