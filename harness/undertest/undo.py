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

import operator
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
        copies: dict[int, tuple[tuple[Any, Any, object], dict[str, Any]]] = {}
        for name, module in _scope():
            tagged, attrs = _copy_of(module, copies)
            snap.module_tags[name], snap.modules[name] = tagged, attrs
            for value in _classes_of(name, attrs):
                if id(value) not in seen:
                    seen.add(id(value))
                    klass_tagged, klass_attrs = _copy_of(value, copies)
                    snap.class_tags.append(klass_tagged)
                    snap.classes.append((value, klass_attrs))
        _COPIES.clear()
        _COPIES.update(copies)
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


_SCOPE_PREFIXES = tuple(s + "." for s in SCOPES)
_IN_ROOTS = operator.methodcaller("startswith", SCOPES)


def _in_scope(name: str) -> bool:
    return name in SCOPES or name.startswith(_SCOPE_PREFIXES)  # C speed: sys.modules holds thousands of names


def _tagged(obj: Any) -> tuple[Any, Any, object]:
    """``obj`` (kept alive: its reader holds no reference), a reader of its dict's version tag, the tag now."""
    reader = tag_of(obj)
    return obj, reader, TAG_VALUE(reader)


#: id of a namespace -> (``_tagged``'s, a copy of its attributes made after that tag was read), as the last
#: ``take`` made them: a namespace whose tag has not moved since holds the same attributes, and the next
#: ``take`` shares that copy (``restore`` only reads it) instead of copying it again
_COPIES: dict[int, tuple[tuple[Any, Any, object], dict[str, Any]]] = {}


def _copy_of(obj: Any, copies: dict) -> tuple[tuple[Any, Any, object], dict[str, Any]]:
    """(``obj`` tagged, a copy of its attributes): the last ``take``'s where its tag has not moved
    since, else made now (the tag read before the copy: a change in between shows). Noted in ``copies``."""
    known = _COPIES.get(id(obj))
    if known is not None and _unmoved(known[0], obj):
        copies[id(obj)] = known
        return known
    tagged = _tagged(obj)
    copies[id(obj)] = made = (tagged, dict(vars(obj)))
    return made


def _unmoved(tagged: tuple[Any, Any, object] | None, obj: Any) -> bool:
    """Whether ``tagged`` (``_tagged``'s, or None) is ``obj``'s and its dict's tag has not moved since."""
    return tagged is not None and tagged[0] is obj and TAG_VALUE(tagged[1]) == tagged[2]


#: (``sys.modules``' dict version tag, the in-scope (name, module) pairs then): the scan is made again once the tag moved
_SCOPE: list = [None, []]
#: module name -> (the copy of its attributes ``_copy_of`` gave, the in-scope classes among them)
_CLASSES: dict[str, tuple[dict[str, Any], list[type]]] = {}


def _scope() -> list[tuple[str, ModuleType]]:
    """The in-scope modules of ``sys.modules``, looked for again only where a module was added, removed or replaced."""
    tag = TAG_VALUE(dict_tag(sys.modules))
    if _SCOPE[0] != tag:
        modules = sys.modules
        names = filter(_IN_ROOTS, list(modules))  # at C speed: sys.modules holds thousands of names
        _SCOPE[:] = [tag, [(n, m) for n in names if _in_scope(n) and isinstance(m := modules.get(n), ModuleType)]]
    return _SCOPE[1]


def _classes_of(name: str, attrs: dict[str, Any]) -> list[type]:
    """The in-scope classes among a module's attributes (``attrs``: ``_copy_of``'s copy), looked for again
    only where that copy is a new one (the module's namespace changed since the last take)."""
    known = _CLASSES.get(name)
    if known is not None and known[0] is attrs:
        return known[1]
    found = [v for v in attrs.values() if isinstance(v, type) and _in_scope(getattr(v, "__module__", "") or "")]
    _CLASSES[name] = (attrs, found)
    return found
