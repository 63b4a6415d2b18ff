"""Find the scenarios: every module in ``scenarios/`` (and any extra folder) that defines
``SCENARIO`` (one) or ``SCENARIOS`` (several)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

from harness.spec import Scenario, import_file

__all__ = ["load_scenarios", "module_of", "select"]

_MODULE_OF: dict[str, str] = {}


def module_of(name: str) -> str:
    """The module that defines scenario ``name`` (after ``load_scenarios``)."""
    return _MODULE_OF[name]


def load_scenarios(extra_dirs: list[str] | None = None) -> dict[str, Scenario]:
    """All scenarios by name, in file order. Duplicate names are an error."""
    import scenarios as package

    found: dict[str, Scenario] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        _collect(importlib.import_module(f"scenarios.{info.name}"), found)
    for folder in extra_dirs or []:
        path = Path(folder)
        if not path.is_dir():
            raise ValueError(f"scenario folder not found: {folder}")
        for file in sorted(path.glob("*.py")):
            if file.name.startswith("_"):
                continue
            _collect(import_file(file, f"_fsdp_compat_user_scenarios.{file.stem}"), found)
    return found


def _collect(module, found: dict[str, Scenario]) -> None:
    items = list(getattr(module, "SCENARIOS", []))
    if hasattr(module, "SCENARIO"):
        items.insert(0, module.SCENARIO)
    for s in items:
        if not isinstance(s, Scenario):
            raise TypeError(f"{module.__name__}: SCENARIO(S) must hold Scenario objects, got {type(s).__name__}")
        if s.name in found:
            raise ValueError(f"duplicate scenario name {s.name!r} in {module.__name__}")
        found[s.name] = s
        _MODULE_OF[s.name] = module.__name__


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
