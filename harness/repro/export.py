"""Export one cell as a standalone script that needs only torch.

The script is ``harness/repro/standalone.py`` with its ``HEADER`` (the cell, its expectation,
the patches module and patch mapping) and ``SOURCES`` (the harness modules it runs, the
scenario file and the scenario helpers it imports, and for a patched cell the patches
module) filled in, so it runs on a machine where this project is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

from harness.plan.cells import Cell
from harness.vocabulary import DEFAULT_MODULE

__all__ = ["export_script"]

HARNESS = Path(__file__).resolve().parents[1]
#: harness modules the standalone script needs (all depend on torch alone)
HARNESS_MODULES = ("vocabulary", "versions", "imports", "scenario.apis", "scenario.sharding", "scenario.expect", "scenario.symptoms", "scenario.spec", "spec", "train.step",
                   "plan.cells", "train.recipe", "train.reference", "train.compare", "train.norm_group", "train.gather",
                   "train.ledger", "train.resources", "train.meta_build", "train.faults", "train.hooks", "train.probe", "train.requested", "train.fsdp", "versiontags", "undertest.source", "undertest.code_ran", "undertest.install", "scenario.load")
EXPORTED_PATCHES = "_exported_patches"
_SCENARIO_IMPORT = re.compile(r"^\s*(?:from|import)\s+(scenarios\.[\w.]+)", re.M)


def export_script(cell: Cell, module: str, path: Path, *, patches_module: str = DEFAULT_MODULE,
                  patch_mapping: dict[str, str] | None = None) -> Path:
    """Write the standalone script for ``cell`` (its scenario defined in ``module``) to ``path``."""
    import torch

    sources: dict[str, tuple[str, bool]] = {"harness": ("", True), "scenarios": ("", True)}
    for name in HARNESS_MODULES:
        parts = name.split(".")
        for depth in range(1, len(parts)):  # the role folders, with their __init__
            package = ".".join(parts[:depth])
            sources.setdefault(f"harness.{package}", ((HARNESS / package.replace(".", "/") / "__init__.py").read_text(),
                                                      True))
        sources[f"harness.{name}"] = ((HARNESS / f"{name.replace('.', '/')}.py").read_text(), False)
    _add_scenario_modules(module, sources)
    patched = cell.variant != "vanilla" and bool(cell.patches)
    if patched:
        _add_patches(patches_module, sources)
    header = {
        "scenario": cell.scenario,
        "module": module,
        "stem": module.rsplit(".", 1)[-1],
        "cell": dataclasses.asdict(cell),
        "patches_module": patches_module if patched else None,
        "patches_import": (EXPORTED_PATCHES if _is_path(patches_module) else patches_module) if patched else None,
        "patch_mapping": dict(patch_mapping or {}),
        "exported_with_torch": torch.__version__,
    }
    launch = "python" if cell.world_size == 1 else f"torchrun --standalone --nproc-per-node {cell.world_size}"
    text = (Path(__file__).with_name("standalone.py")).read_text()
    text = _fill(text, "HEADER", header)
    text = _fill(text, "SOURCES", sources)
    intro = (f"# {cell.label}, exported with torch {torch.__version__} by fsdp-compat.\n"
             f"# Run: {launch} {path.name}\n")
    first, rest = text.split("\n", 1)
    path.write_text(f"{first}\n{intro}{rest}")
    path.chmod(0o755)
    return path


def _fill(text: str, name: str, value: object) -> str:
    line = f"{name} = {{}}  # filled by harness.repro.export"
    assert text.count(line) == 1, f"standalone.py must hold exactly one line {line!r}"
    return text.replace(line, f"{name} = {value!r}")


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec


def _add_scenario_modules(module: str, sources: dict[str, tuple[str, bool]]) -> None:
    found = sys.modules.get(module)
    origin = getattr(found, "__file__", None)
    if origin is None:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
    assert origin, f"cannot find the source of {module}"
    text = Path(origin).read_text()
    sources[module] = (text, False)
    for dep in _SCENARIO_IMPORT.findall(text):
        if dep not in sources:
            _add_scenario_modules(dep, sources)


def _add_patches(spec: str, sources: dict[str, tuple[str, bool]]) -> None:
    if _is_path(spec):
        path = Path(spec)
        if path.is_dir():
            sources[EXPORTED_PATCHES] = ((path / "__init__.py").read_text(), True)
            for file in sorted(path.glob("*.py")):
                if file.name != "__init__.py":
                    sources[f"{EXPORTED_PATCHES}.{file.stem}"] = (file.read_text(), False)
        else:
            sources[EXPORTED_PATCHES] = (path.read_text(), False)
        return
    found = importlib.util.find_spec(spec)
    if found is None or not found.origin:
        raise ValueError(f"patches module {spec!r} cannot be found to export")
    origin = Path(found.origin)
    if found.submodule_search_locations:
        sources[spec] = (origin.read_text(), True)
        for file in sorted(origin.parent.glob("*.py")):
            if file.name != "__init__.py":
                sources[f"{spec}.{file.stem}"] = (file.read_text(), False)
    else:
        sources[spec] = (origin.read_text(), False)
