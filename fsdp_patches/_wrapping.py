"""Install, detect and undo the wrappers every patch puts on torch's FSDP2 internals.

Rules every patch follows (and a patch added later should follow too):

* **Wrap what is there now.** A patch wraps the current value of each attribute it
  changes, so a wrapper that other code installed first keeps running (inside ours), and
  one installed later runs around ours.
* **Idempotent.** Every wrapper carries a ``_Mark`` under ``PATCH_MARKER``: the patch
  name, whether it is active, and the wrapper it belongs to (``functools.wraps`` copies
  the mark into whatever wraps ours, so a mark counts only on its own wrapper). An
  install walks the ``__wrapped__`` chain of the current value, through other code's
  wrappers too, and returns "already-installed" when an active wrapper of its own is
  there.
* **Undoable.** Each install is recorded; ``undo_patch(name)`` deactivates the patch's
  wrappers and, where a wrapper is still the attribute's value, puts back what it
  wrapped. A wrapper that other code wrapped since stays in their chain as a
  pass-through, so their wrapper keeps working.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PATCH_MARKER",
    "Around",
    "PatchResult",
    "active_wrapper_in_chain",
    "already_installed",
    "chain",
    "error",
    "installed",
    "make_wrapper",
    "not_applicable",
    "replace_attribute",
    "undo_all",
    "undo_patch",
]

#: Attribute that holds a ``_Mark`` on every wrapper this package installs.
PATCH_MARKER = "__fsdp_compat_patch__"

#: ``around(call, *args, **kwargs)``: the patch's behaviour; ``call`` is the wrapped value.
Around = Callable[..., Any]

#: Longest ``__wrapped__`` chain followed (a guard against self-referencing objects).
_MAX_CHAIN = 64
_MISSING = object()


@dataclass(kw_only=True, frozen=True)
class PatchResult:
    """Outcome of one install call; ``undo()`` takes the patch out again."""

    name: str
    status: str  # "installed" | "already-installed" | "not-applicable" | "error"
    reason: str

    def undo(self) -> list[str]:
        """Undo patch ``name`` (whichever call installed it); one line per attribute.

        Idempotent: a second call, or one for a patch that installed nothing, returns [].
        """
        return undo_patch(self.name)


def installed(name: str, reason: str) -> PatchResult:
    return PatchResult(name=name, status="installed", reason=reason)


def already_installed(name: str, reason: str = "wrapper already present") -> PatchResult:
    return PatchResult(name=name, status="already-installed", reason=reason)


def not_applicable(name: str, reason: str) -> PatchResult:
    return PatchResult(name=name, status="not-applicable", reason=reason)


def error(name: str, reason: str) -> PatchResult:
    return PatchResult(name=name, status="error", reason=reason)


# ------------------------------------------------------------------------- marks


@dataclass(kw_only=True, eq=False)
class _Mark:
    patch: str
    wrapper: Callable[..., Any]
    active: bool = True


def _safe_getattr(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, also ``None`` for objects whose ``getattr`` raises."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _own_mark(obj: Any) -> _Mark | None:
    """The mark of ``obj`` when ``obj`` is one of our wrappers (not a copy's mark)."""
    mark = _safe_getattr(obj, PATCH_MARKER)
    return mark if _safe_getattr(mark, "wrapper") is obj else None


def chain(obj: Any) -> Iterator[Any]:
    """``obj``, then what it wraps (``__wrapped__``), and so on, whoever made the wrappers."""
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(obj))
        yield obj
        obj = _safe_getattr(obj, "__wrapped__")


def active_wrapper_in_chain(obj: Any, patch: str) -> bool:
    """Whether an active wrapper of ``patch`` is anywhere in ``obj``'s chain."""
    for link in chain(obj):
        mark = _own_mark(link)
        if mark is not None and mark.patch == patch and mark.active:
            return True
    return False


def make_wrapper(wrapped: Callable[..., Any], patch: str, around: Around) -> Callable[..., Any]:
    """A function that calls ``around(wrapped, *args, **kwargs)`` while active and plain
    ``wrapped(*args, **kwargs)`` once undone. A function, so it binds as a method too."""

    @functools.wraps(wrapped)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if mark.active:
            return around(wrapped, *args, **kwargs)
        return wrapped(*args, **kwargs)

    mark = _Mark(patch=patch, wrapper=wrapper)
    setattr(wrapper, PATCH_MARKER, mark)  # after wraps(), which copies wrapped's __dict__
    return wrapper


# ------------------------------------------------------------------ install, undo


@dataclass(kw_only=True, eq=False)
class _Slot:
    """One attribute a patch replaced: enough to put it back."""

    patch: str
    owner: Any
    attr: str
    wrapper: Callable[..., Any]
    previous: Any = field(default=_MISSING)  # the owner's own value before, if any

    def label(self) -> str:
        owner = getattr(self.owner, "__name__", type(self.owner).__name__)
        return f"{owner.rsplit('.', 1)[-1]}.{self.attr}"

    def undo(self) -> str:
        mark = _own_mark(self.wrapper)
        if mark is not None:
            mark.active = False
        if vars(self.owner).get(self.attr, _MISSING) is not self.wrapper:
            return f"{self.label()}: wrapped or replaced by other code since; ours now passes through"
        previous = _skip_undone(self.previous)
        if previous is _MISSING:
            delattr(self.owner, self.attr)
        else:
            setattr(self.owner, self.attr, previous)
        return f"{self.label()}: restored"


#: Every attribute replaced by an install of this package and not undone yet, in order.
_SLOTS: list[_Slot] = []


def _skip_undone(value: Any) -> Any:
    """``value`` without undone wrappers of ours on top (they would only pass through)."""
    while (mark := _own_mark(value)) is not None and not mark.active:
        value = value.__wrapped__
    return value


def replace_attribute(owner: Any, attr: str, wrapper: Callable[..., Any]) -> str:
    """Set ``owner.attr`` to our ``wrapper`` and record how to undo it; returns a label."""
    mark = _own_mark(wrapper)
    if mark is None:
        raise ValueError(f"{wrapper!r} is not a wrapper made by make_wrapper")
    slot = _Slot(patch=mark.patch, owner=owner, attr=attr, wrapper=wrapper,
                 previous=vars(owner).get(attr, _MISSING))
    setattr(owner, attr, wrapper)
    _SLOTS.append(slot)
    return slot.label()


def undo_patch(patch: str) -> list[str]:
    """Undo every install of ``patch``, newest first; one line per attribute."""
    mine = [slot for slot in _SLOTS if slot.patch == patch]
    for slot in mine:
        _SLOTS.remove(slot)
    return [slot.undo() for slot in reversed(mine)]


def undo_all() -> dict[str, list[str]]:
    """Undo every patch of this package, newest install first; per patch, its lines."""
    done: dict[str, list[str]] = {}
    while _SLOTS:
        patch = _SLOTS[-1].patch
        done.setdefault(patch, []).extend(undo_patch(patch))
    return done
