"""What a cell or a patch set changed in its process beyond ``harness.rank.state``'s settings,
named without a fixed list of attributes:

* ``TorchAttributes``: every attribute of every loaded ``torch`` module and of every class
  defined in one (a wrapped ``torch.nn.functional.linear``, a replaced
  ``FSDPParamGroup.post_backward``, a new attribute); a submodule bound on import is not a change;
* ``harness.rank.registries.Registries``: what torch keeps in containers rather than
  attributes (global module hooks, default saved-tensor hooks, compiler configs).

A replacement whose code lives in torch itself is torch's own set-up on first use, not a
change of the cell's (importing ``torch._dynamo`` wraps ``torch.manual_seed``; an
optimizer's first instance wraps its class's ``step``). So is a value set from a setting
``harness.rank.state`` names (``set_default_dtype`` sets ``torch.Storage``).

A rank takes ``TorchAttributes`` once, before any cell (its zygote and the cells forked from
it inherit it). After a patch set is installed, what changed is the set's
(``Record.patch_changes``); after each cell, what else changed is the cell's
(``Record.left_state``). Where cells share a process (``harness.plan.placement``, isolate
"snapshot"), both are put back: the cell's changes after the cell, the set's when the set
changes; the registries and settings a cell changed after the cell (``CellState``). Where
each cell has a process of its own ("fork"), nothing needs putting back.

Not covered: C++ state changed without a Python attribute or registry read here (a kernel
replaced through the dispatcher, ``torch.library`` registrations, which torch itself adds
as its submodules load): ``--isolate fork``.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from itertools import compress
from operator import ne
from types import ModuleType
from typing import Any

import torch

from harness.rank.registries import Registries
from harness.rank.state import GlobalState
from harness.versiontags import TAG_VALUE, tag_of

__all__ = ["CellState", "TorchAttributes"]

_MISSING = object()


def _torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


@dataclass
class TorchAttributes:
    """(object, its attribute names, their values) for every torch module and class, at ``take()``.

    A scan compares every namespace with what ``take()`` saw (``_same``: 11 ms for 4,578
    namespaces on torch 2.13, after every cell). Where CPython keeps a version tag in each dict
    that changes with every change to it (``harness.versiontags``, checked at import), a namespace
    whose tag has not moved since a scan found it as ``take()`` saw it is skipped."""

    held: list[tuple[Any, tuple[str, ...], tuple[Any, ...]]] = field(default_factory=list)
    #: per namespace of ``held``: a reader of its dict's version tag (``versiontags.NO_TAG``: none)
    tags: list[Any] = field(init=False)
    #: per namespace of ``held``: its dict's version tag when a scan last found nothing in it to
    #: name (as ``take()`` saw it, or with only plain values moved)
    clean: list[object] = field(init=False)

    def __post_init__(self) -> None:
        self.tags = [tag_of(obj) for obj, _, _ in self.held]
        self.clean = list(map(TAG_VALUE, self.tags))

    @classmethod
    def take(cls) -> TorchAttributes:
        held: list[tuple[Any, tuple[str, ...], tuple[Any, ...]]] = []
        seen: set[int] = set()
        for name, module in list(sys.modules.items()):
            if not isinstance(module, ModuleType) or not _torch_module(name):
                continue
            attrs = vars(module)
            held.append((module, tuple(attrs), tuple(attrs.values())))
            for value in list(attrs.values()):
                if isinstance(value, type) and id(value) not in seen:
                    owner = value.__dict__.get("__module__")
                    if isinstance(owner, str) and _torch_module(owner):
                        seen.add(id(value))
                        held.append((value, tuple(value.__dict__), tuple(value.__dict__.values())))
        return cls(held=held)

    def changes(self, *, added: bool = True) -> list[str]:
        """Dotted names whose function, method or class was replaced, added or removed since
        ``take()`` (``torch.nn.functional.linear``). Plain values (counters, caches, flags torch
        sets on first use) are left out: torch changes them itself; its configs and settings are
        ``Registries``' and ``harness.rank.state``'s. ``added=False`` leaves out a callable added
        where torch had none: torch's code does not call what it does not define, so it cannot
        change what torch runs (transformers adds ``torch.nn.Module.smart_apply`` at a model's
        first init); ``restore`` takes it out all the same."""
        return sorted({name for name, _, _, old in self._changed() if added or old is not _MISSING})

    def current(self, names: list[str]) -> dict[str, Any]:
        """The values the named attributes hold now (``_MISSING`` where removed)."""
        return {name: obj.__dict__.get(key, _MISSING) for name, obj, key, _ in self._changed() if name in names}

    def restore(self, keep: dict[str, Any] | None = None) -> list[str]:
        """Put every changed function, method and class back as ``take()`` saw it, except the
        attributes in ``keep`` (name -> value: a patch set's own), which get that value back;
        the names of those that had to be put back (an addition taken out is not named)."""
        keep = keep or {}
        out = []
        for name, obj, key, old in self._changed():
            target = keep.get(name, old)
            if obj.__dict__.get(key, _MISSING) is target:
                continue
            try:
                if target is _MISSING:
                    delattr(obj, key)
                else:
                    setattr(obj, key, target)
            except (AttributeError, TypeError):
                continue
            if old is not _MISSING:  # an addition is taken out unnamed (``changes``)
                out.append(name)
        return sorted(set(out))

    def _changed(self) -> list[tuple[str, Any, str, Any]]:
        """(dotted name, owner, attribute, value at ``take()``) for each change ``changes`` names."""
        out: list[tuple[str, Any, str, Any]] = []
        tags = list(map(TAG_VALUE, self.tags))  # every namespace's tag, read and compared at C speed
        for i in list(compress(range(len(tags)), map(ne, tags, self.clean))):
            obj, keys, values = self.held[i]
            now = obj.__dict__
            if _same(now, keys, values):
                self.clean[i] = tags[i]
                continue
            before = dict(zip(keys, values))
            label = obj.__name__ if isinstance(obj, ModuleType) else f"{obj.__module__}.{obj.__qualname__}"
            found = len(out)
            for key, value in now.items():
                old = before.get(key, _MISSING)
                if old is value or key.startswith("__"):
                    continue
                if old is _MISSING and isinstance(value, ModuleType):
                    continue  # ``import torch.x.y`` binds y on torch.x
                if old is None:
                    continue  # a cache torch fills on first use (``_FakeScriptObject_cls``)
                if not _code_like(value) or _from_torch(value) or f"{label}.{key}" in _DERIVED:
                    continue
                out.append((f"{label}.{key}", obj, key, old))
            out += [(f"{label}.{key} (removed)", obj, key, before[key]) for key in before.keys() - now.keys()
                    if not key.startswith("__") and _code_like(before[key])]
            if len(out) == found:
                # only plain values moved (a counter, a cache torch fills): nothing to name or put
                # back while the dict stays as it is now
                self.clean[i] = tags[i]
        return out


#: attributes torch sets from a setting ``harness.rank.state`` names (``set_default_dtype`` sets ``torch.Storage``)
_DERIVED = frozenset({"torch.Storage"})


def _same(now: Any, keys: tuple[str, ...], values: tuple[Any, ...]) -> bool:
    """Whether a namespace still holds ``keys`` with ``values``, checked at C speed: tuple
    equality tests identity before ``==``, so an unchanged namespace never calls ``__eq__``."""
    if len(now) != len(keys):
        return False
    try:
        return tuple(now.values()) == values and tuple(now) == keys
    except Exception:  # a changed value whose == raises (a tensor): changed
        return False


def _code_like(value: Any) -> bool:
    """A function, method, class or other callable: what a patch replaces."""
    return callable(value) and not isinstance(value, ModuleType)


def _from_torch(value: Any, depth: int = 0) -> bool:
    """Whether a callable's code lives in torch's own files (a wrapper torch sets up itself)."""
    code = getattr(value, "__code__", None)
    if code is not None:
        return code.co_filename.startswith(_TORCH_DIR)
    inner = getattr(value, "__func__", None) or getattr(value, "func", None)  # a bound method, a partial
    if inner is not None and depth < 3:
        return _from_torch(inner, depth + 1)
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    return module is not None and (getattr(module, "__file__", None) or "").startswith(_TORCH_DIR) \
        if isinstance(value, type) else _torch_module(getattr(value, "__module__", None) or "")


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


@dataclass(kw_only=True)
class CellState:
    """Process-wide state at a cell's start (``harness.rank.state``'s settings, the registries,
    this process's child processes): put back where cells share a process, compared where the
    cell has its own. A child process the cell left running is ended either way."""

    state: GlobalState
    registries: Registries
    children: frozenset[int]

    @classmethod
    def take(cls) -> CellState:
        return cls(state=GlobalState.take(), registries=Registries.take(), children=_children())

    def settle(self, *, put_back: bool) -> list[str]:
        left = [*self._end_children()]
        if not put_back:
            return [*self.state.changes(), *self.registries.changes(), *left]
        return [*self.state.restore(), *self.registries.settle(put_back=True), *left]

    def _end_children(self) -> list[str]:
        """The child processes started during the cell that still run: ended (SIGKILL, reaped)."""
        import psutil

        fresh = _children() - self.children
        if not fresh:
            return []
        new = []
        for pid in fresh:
            try:
                proc = psutil.Process(pid)
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    new.append(proc)
            except psutil.Error:
                continue
        names = []
        for proc in new:
            try:
                names.append(proc.name())
                proc.kill()
                proc.wait(5)
            except psutil.Error:
                continue
        return [f"left {len(names)} child process(es) running: {', '.join(sorted(set(names)))} (ended)"] if names else []


_NATIVE_SEEN: set[int] = set()


def _children() -> frozenset[int]:
    """This process's child processes: from ``/proc/self/task/<thread>/children`` of the main
    thread, every Python thread, and every thread first seen since the last scan, where Linux
    has it (a fraction of a millisecond), else psutil, which reads every process's parent
    (8 ms). Native threads already seen are left out: a rank holds two gloo threads per
    process group it made (over a hundred after a launch's cells, 4.7 ms per scan reading
    them all), and they start no processes. A Python thread that ``join()`` has let go of
    can still hold its children for a moment before the OS ends it (1 scan in 300 missed
    one); it is no longer a Python thread, but it was not a native thread seen before, so
    it is read. Once ended, its children go to a live thread, the main thread first."""
    try:
        pids: set[int] = set()
        python = {os.getpid(), *(t.native_id for t in threading.enumerate() if t.native_id is not None)}
        present = {int(t) for t in os.listdir("/proc/self/task")}
        for tid in python | (present - _NATIVE_SEEN):
            try:
                with open(f"/proc/self/task/{tid}/children") as f:
                    pids.update(int(p) for p in f.read().split())
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        _NATIVE_SEEN.clear()
        _NATIVE_SEEN.update(present - python)
        return frozenset(pids)
    except (OSError, ValueError):
        pass
    import psutil

    try:
        return frozenset(p.pid for p in psutil.Process().children())
    except psutil.Error:
        return frozenset()
