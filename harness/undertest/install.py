"""The patches module under test: find it, map scenario patch names to its functions, install.

Any module works if it has functions of this kind:

* ``patch_fsdp_<name>()`` or ``patch_<name>()``: a process-global install, no arguments.
  It may return an object with ``status`` ("installed", "already-installed",
  "not-applicable") and ``reason``; returning ``None`` means installed; raising (or
  ``sys.exit``) means the install failed, recorded as ``patch install error: <first line>``.
* ``<name>_`` or ``<name>``: a utility the recipe calls instead of torch's
  (``clip_grad_norm`` -> ``clip_grad_norm_(params, max_norm, norm_type)``,
  ``scale_grads`` -> ``scale_grads_(params, scaler)``, ``finalize_backward`` ->
  ``finalize_backward(root)`` after an accumulation window run with gradient sync off).

A mapping (``{"uniform_reduce_dtype": "my_widen_patch"}``) overrides the lookup. A name
the module has no function for is "not-provided": the cell's other patches still
install and run.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from harness.imports import import_file
from harness.undertest.code_ran import ProbedLoader, install_finder
from harness.undertest.source import UTILITIES, Utilities, is_path
from harness.vocabulary import DEFAULT_MODULE

__all__ = [
    "DEFAULT_MODULE",
    "UTILITIES",
    "InstallOutcome",
    "PatchNotProvided",
    "install_patches",
    "install_set",
    "load_patches_module",
    "module_root",
    "resolve",
]



@dataclass(kw_only=True, frozen=True)
class InstallOutcome:
    name: str
    status: str  # installed | already-installed | not-applicable | error
    reason: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


def module_root(spec: str) -> Path | None:
    """The folder of the patches module ``spec`` (a package), or its file; None where a
    dotted name finds none (its import says why). ``ValueError`` for a path that is not there."""
    if is_path(spec):
        path = Path(spec).resolve()
        if not path.exists():
            raise ValueError(f"patches module file not found: {spec}")
        return path
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    origin = Path(found.origin).resolve()
    return origin.parent if found.submodule_search_locations else origin


def load_patches_module(spec: str) -> ModuleType:
    """Import ``spec``: a dotted module name or a path to a ``.py`` file, its code probed
    (``harness.undertest.code_ran``: which of its functions a cell ran).

    Raises ``ValueError`` with one line naming the problem when it cannot be loaded.
    """
    root = module_root(spec)
    if root is not None:
        install_finder(root)
    if is_path(spec):
        path = Path(spec).resolve()
        try:
            module = import_file(path, f"_fsdp_compat_patches_{path.stem}",
                                 loader=lambda name, file: ProbedLoader(name, file, root))
        except SystemExit as e:
            raise ValueError(_exited_at_import(e)) from e
        except Exception as e:  # a broken module is the user's input, not our crash
            raise ValueError(f"patches module {spec} failed to import: {_first_line(e)}") from e
        return module
    try:
        return importlib.import_module(spec)
    except SystemExit as e:
        raise ValueError(_exited_at_import(e)) from e
    except ImportError as e:
        raise ValueError(f"patches module {spec!r} cannot be imported: {_first_line(e)}") from e


def _exited_at_import(e: SystemExit) -> str:
    return f"patches module exited at import (SystemExit {e.code})"


class PatchNotProvided(LookupError):
    """The module has no function for a patch name (and no mapping names one)."""


def resolve(module: ModuleType, name: str, mapping: Mapping[str, str] | None = None,
            label: str | None = None) -> Callable[..., object]:
    """The function of ``module`` serving patch ``name``.

    ``PatchNotProvided`` when the module simply has none; ``LookupError`` when a mapping
    names a function the module lacks (a mistake in the mapping).
    """
    label = label or module.__name__
    if mapping and name in mapping:
        fn = getattr(module, mapping[name], None)
        if not callable(fn):
            raise LookupError(f"patch target missing: {label} has no {mapping[name]} (mapped from {name})")
        return fn
    candidates = [f"{name}_", name] if name in UTILITIES else [f"patch_fsdp_{name}", f"patch_{name}"]
    for attr in candidates:
        fn = getattr(module, attr, None)
        if callable(fn):
            return fn
    raise PatchNotProvided(f"{label} has no {' or '.join(candidates)}")


def install_patches(module: ModuleType, names: list[str], mapping: Mapping[str, str] | None = None,
                    label: str | None = None,
                    on_patch: Callable[[str], object] | None = None) -> dict[str, InstallOutcome]:
    """Install each named patch once, in order; never raises. A patch the module does not
    provide is "not-provided" and the others still install. ``on_patch(name)`` is called
    before each install function runs (the rank stamps its phase)."""
    outcomes: dict[str, InstallOutcome] = {}
    for name in names:
        if name in outcomes:
            continue
        try:
            fn = resolve(module, name, mapping, label)
        except PatchNotProvided as e:
            outcomes[name] = InstallOutcome(name=name, status="not-provided", reason=str(e))
            continue
        except LookupError as e:
            outcomes[name] = InstallOutcome(name=name, status="error", reason=str(e))
            continue
        if name in UTILITIES:
            outcomes[name] = InstallOutcome(name=name, status="installed", reason=f"uses {fn.__name__}")
            continue
        if on_patch is not None:
            on_patch(name)
        try:
            result = fn()
        except SystemExit as e:
            reason = f"{getattr(fn, '__name__', name)} exited at install (SystemExit {e.code})"
            outcomes[name] = InstallOutcome(name=name, status="error", reason=reason)
            continue
        except Exception as e:
            outcomes[name] = InstallOutcome(name=name, status="error", reason=_first_line(e))
            continue
        status = getattr(result, "status", None) or "installed"
        reason = getattr(result, "reason", "") or ""
        outcomes[name] = InstallOutcome(name=name, status=str(status), reason=str(reason))
    return outcomes


def install_set(module: ModuleType, names: list[str], mapping: Mapping[str, str] | None = None,
                label: str | None = None, on_patch: Callable[[str], object] | None = None,
                ) -> tuple[dict[str, dict[str, str]], Utilities]:
    """Install a patch set: per-patch outcomes (as record entries) and the utilities to call."""
    outcomes = install_patches(module, names, mapping, label, on_patch)
    utilities = Utilities(**{n: resolve(module, n, mapping, label) for n in names
                             if n in UTILITIES and outcomes[n].status == "installed"})
    return {n: o.as_dict() for n, o in outcomes.items()}, utilities


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
