"""Find the scenarios: every module in ``scenarios/`` (and any extra folder) that defines
``SCENARIO`` (one, named after its file unless it says otherwise) or ``SCENARIOS``
(several, each named)."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from harness.imports import import_file
from harness.spec import Scenario

__all__ = ["Library", "load_scenarios", "named_scenarios", "select"]

USER_PACKAGE = "_fsdp_compat_user_scenarios"


@dataclass(kw_only=True)
class Library:
    """The scenarios found, by name, and the module that defines each."""

    scenarios: dict[str, Scenario] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)


def load_scenarios(extra_dirs: list[str] | None = None) -> Library:
    """All scenarios by name, in file order. Duplicate names are an error."""
    import scenarios as package

    library = Library()
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            _collect(importlib.import_module(f"scenarios.{info.name}"), info.name, library)
    for folder in extra_dirs or []:
        path = Path(folder)
        if not path.is_dir():
            raise ValueError(f"scenario folder not found: {folder}")
        for file in sorted(path.glob("*.py")):
            if not file.name.startswith("_"):
                _collect(import_file(file, f"{USER_PACKAGE}.{file.stem}"), file.stem, library)
    return library


def named_scenarios(module: ModuleType, stem: str) -> list[Scenario]:
    """The scenarios a module defines, with ``name`` and ``summary`` filled from the file."""
    items: list[Scenario] = list(getattr(module, "SCENARIOS", []))
    if hasattr(module, "SCENARIO"):
        items.insert(0, module.SCENARIO)
    summary = ((module.__doc__ or "").strip().splitlines() or [""])[0]
    named = []
    for s in items:
        if not isinstance(s, Scenario):
            raise TypeError(f"{module.__name__}: SCENARIO(S) must hold Scenario objects, got {type(s).__name__}")
        if not s.name:
            if s is not getattr(module, "SCENARIO", None):
                raise ValueError(f"{module.__name__}: every scenario in SCENARIOS needs a name")
            s = s.replace(name=stem)
        named.append(s if s.summary else s.replace(summary=summary))
    return named


def _collect(module: ModuleType, stem: str, library: Library) -> None:
    for s in named_scenarios(module, stem):
        if s.name in library.scenarios:
            raise ValueError(f"duplicate scenario name {s.name!r} in {module.__name__}")
        library.scenarios[s.name] = s
        library.modules[s.name] = module.__name__


def select(all_scenarios: dict[str, Scenario], names: list[str] | None) -> list[Scenario]:
    """The named scenarios (``ValueError`` naming an unknown one), or all of them."""
    if not names:
        return list(all_scenarios.values())
    chosen = []
    for n in names:
        if n not in all_scenarios:
            raise ValueError(f"unknown scenario {n!r} (see `python -m harness list`)")
        chosen.append(all_scenarios[n])
    return chosen
