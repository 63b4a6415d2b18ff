"""Dict version tags (PEP 509): a cheap "has this namespace changed since?" for the isolation
scan (``harness.rank.leaks.TorchAttributes``, ``harness.rank.registries``), the patch-set undo
(``harness.undertest.undo``) and the scan of imported modules (``harness.undertest.code_ran``,
through ``sys.modules``' own tag). CPython bumps a dict's ``ma_version_tag`` on
every change; ``tag_of`` gives a live reader of it for a module's or class's attribute dict.
Where the interpreter has no such tag (checked at import on a dict of our own), every reader is
``NO_TAG``, which reads as changed every time: the scan then compares every namespace in full.
"""

from __future__ import annotations

import ctypes
import gc
import operator
import sys
from types import ModuleType
from typing import Any

__all__ = ["NO_TAG", "TAG_OFFSET", "TAG_VALUE", "dict_tag", "tag_of"]


def _version_tag_offset() -> int | None:
    """Where CPython keeps a dict's version tag (PEP 509: ``ma_version_tag``, after the object
    header and ``ma_used``), if this interpreter has one that changes with every change to the
    dict: checked on a dict of our own, else None (no fast path, every namespace compared)."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 14):
        return None
    word = ctypes.sizeof(ctypes.c_ssize_t)
    probe = {"a": 1, "b": 2, "c": 3}
    try:
        if ctypes.c_ssize_t.from_address(id(probe) + 2 * word).value != len(probe):
            return None  # not the layout expected (a debug build's larger header)
        tag = ctypes.c_uint64.from_address(id(probe) + 3 * word)
        seen = [tag.value]
        for change in (lambda: probe.__setitem__("a", 4), lambda: probe.__setitem__("d", 5),
                       lambda: probe.__delitem__("b")):
            change()
            seen.append(tag.value)
        return 3 * word if len(set(seen)) == len(seen) else None
    except Exception:
        return None


TAG_OFFSET = _version_tag_offset()


class _NoTag:
    """The tag reader of a namespace without a fast path: it reads as moved every time."""

    @property
    def value(self) -> object:
        return object()


NO_TAG = _NoTag()
#: reads a tag reader's value (``map`` over every namespace's reader at C speed)
TAG_VALUE = operator.attrgetter("value")


def tag_of(obj: Any) -> Any:
    """A live reader (``.value``) of the version tag of ``obj``'s attribute dict (``NO_TAG``
    where there is none to read: that namespace is compared in full on every scan)."""
    if TAG_OFFSET is None:
        return NO_TAG
    d = vars(obj) if isinstance(obj, ModuleType) else next(iter(gc.get_referents(obj.__dict__)), None)
    return dict_tag(d)


def dict_tag(d: Any) -> Any:
    """A live reader (``.value``) of the version tag of the dict ``d`` itself (``NO_TAG`` for
    anything else, or where the interpreter has none). The reader holds no reference to ``d``:
    keep ``d`` alive as long as the reader is read."""
    if TAG_OFFSET is None or type(d) is not dict:
        return NO_TAG
    return ctypes.c_uint64.from_address(id(d) + TAG_OFFSET)
