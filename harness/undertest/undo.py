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

from harness.versiontags import TAG_VALUE, dict_tag, tag_of

__all__ = ["SCOPES", "PatchUndo", "forget_module", "preload"]

SCOPES = ("torch.distributed", "torch.nn.utils", "torch.optim")
_MISSING = object()


@dataclass
class PatchUndo:
    """Attributes of in-scope modules and their classes, as they were at ``take()``.

    Each namespace's dict version tag is read at ``take()`` too (``harness.versiontags``):
    ``changes`` and ``restore`` skip a namespace whose tag has not moved since, as nothing in it
    changed (where the interpreter has no tag, every namespace is compared)."""

    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    classes: list[tuple[type, dict[str, Any]]] = field(default_factory=list)
    #: per module name, and per class (``classes``' order): (the module or class, a reader of its dict's tag, the tag)
    module_tags: dict[str, tuple[Any, Any, object]] = field(default_factory=dict)
    class_tags: list[tuple[Any, Any, object]] = field(default_factory=list)

    @classmethod
    def take(cls) -> PatchUndo:
        preload()
        snap = cls()
        seen: set[int] = set()
        for name, module in _scope():
            snap.module_tags[name] = tagged = _tagged(module)  # the tag before the copy: a change in between shows
            attrs = snap.modules[name] = dict(vars(module))
            for value in _classes_of(name, module, attrs, tagged):
                if id(value) not in seen:
                    seen.add(id(value))
                    snap.class_tags.append(_tagged(value))
                    snap.classes.append((value, dict(vars(value))))
        return snap

    def _targets(self):
        """(label, object, attributes at snapshot time) for every module and class held that may have changed."""
        for name, attrs in self.modules.items():
            module = sys.modules.get(name)
            if module is not None and not _unmoved(self.module_tags.get(name), module):
                yield name, module, attrs
        for i, (klass, attrs) in enumerate(self.classes):
            if not _unmoved(self.class_tags[i] if i < len(self.class_tags) else None, klass):
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
    prefixes = (spec + ".", "_fsdp_compat_patches_")
    for name in [n for n in sys.modules if n == spec or n.startswith(prefixes)]:
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


def _tagged(obj: Any) -> tuple[Any, Any, object]:
    """``obj`` (kept alive: its reader holds no reference), a reader of its dict's version tag, the tag now."""
    reader = tag_of(obj)
    return obj, reader, TAG_VALUE(reader)


def _unmoved(tagged: tuple[Any, Any, object] | None, obj: Any) -> bool:
    """Whether ``tagged`` (``_tagged``'s, or None) is ``obj``'s and its dict's tag has not moved since."""
    return tagged is not None and tagged[0] is obj and TAG_VALUE(tagged[1]) == tagged[2]


#: (``sys.modules``' dict version tag, the in-scope (name, module) pairs then): the scan is made again once the tag moved
_SCOPE: list = [None, []]
#: module name -> (the module, its dict's tag reader, the tag, the in-scope classes its namespace held then)
_CLASSES: dict[str, tuple[Any, Any, object, list[type]]] = {}


def _scope() -> list[tuple[str, ModuleType]]:
    """The in-scope modules of ``sys.modules``, looked for again only where a module was added, removed or replaced."""
    tag = TAG_VALUE(dict_tag(sys.modules))
    if _SCOPE[0] != tag:
        _SCOPE[:] = [tag, [(n, m) for n, m in list(sys.modules.items()) if isinstance(m, ModuleType) and _in_scope(n)]]
    return _SCOPE[1]


def _classes_of(name: str, module: ModuleType, attrs: dict[str, Any], tagged: tuple[Any, Any, object]) -> list[type]:
    """The in-scope classes among a module's attributes (``attrs``: a copy of them made after its tag
    was read, ``tagged``), looked for again only where the module's namespace changed since."""
    known = _CLASSES.get(name)
    if known is not None and _unmoved(known[:3], module):
        return known[3]
    found = [v for v in attrs.values() if isinstance(v, type) and _in_scope(getattr(v, "__module__", "") or "")]
    _CLASSES[name] = (*tagged, found)
    return found
