"""A run's plan, saved by what it was made from, and taken again while all of that is unchanged.

Planning a run loads every scenario file, and a scenario file imports torch (and the hf_ pack
transformers): in ``harness run``'s own process that cost about 1.5 s of CPU, once per version
in ``nox -s matrix``, even where every cell is then answered by a record on disk
(``harness.launch.incremental``). The cells a plan holds are plain data (names, sizes,
expectations and each cell's key), so they are saved (``save``) under a key of everything the
planning step reads, and a later run with the same key takes them (``load``) without loading
a scenario or importing torch.

The key (``plan_key``) covers what a cell's key covers (``harness.plan.inputs``: the torch build,
the installs, the machine, the interpreter and environment, the harness's code) and, for the
whole plan at once: the run's options (all but where its records go and what it reuses), the
Python files of the scenario folders with the files they import, and every file of the module
under test (and of the project's own, whose names are known whatever module is tested) with
what a cell's key holds of it besides: the files outside it that it imports, its parent
packages' ``__init__``, the patch mapping. A plan is kept only where its key is the same after
planning as before (nothing moved meanwhile) and no scenario file failed to load; ``--fresh``
plans from scratch. Plans are files named by their key, beside the run's records (``.plans/``),
the newest ``KEEP`` kept (a run that takes one marks it used once it may write).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.plan.cells import Cell
from harness.plan.inputs import (
    PROJECT_ROOT,
    CellInputs,
    _digest,
    _environment,
    _files_digest,
    _harness_digest,
    _installs,
    _machine,
    _torch_build,
    import_closure,
)
from harness.plan.installed import installed_code
from harness.runconfig import RunConfig
from harness.undertest.source import PatchSource, locate
from harness.vocabulary import DEFAULT_MODULE

__all__ = ["KEEP", "folder", "load", "plan_key", "save", "used"]

#: plans kept per folder (one per version and matrix in ``nox -s matrix``)
KEEP = 32
#: run options that do not change the plan: where its records go and what it may reuse
_NOT_PLANNED = ("out", "run_id", "reuse_from", "fresh")
_FORMAT = 1


def folder(out: Path) -> Path:
    """Where the plans of a run writing ``out`` are kept."""
    return out.parent / ".plans"


def _scenario_files(config: RunConfig) -> list[Path]:
    """Every Python file of the project's scenario folder and of ``config``'s extra folders,
    with every project file each imports (a helper, a model beside them)."""
    dirs = [PROJECT_ROOT / "scenarios", *(Path(d).resolve() for d in config.scenario_dirs)]
    files: set[Path] = set()
    for d in dirs:  # the files loading reads: each folder's own (``harness.scenario.load``), and what they import
        for f in d.glob("*.py") if d.is_dir() else []:
            files |= import_closure(f, [PROJECT_ROOT, d], skip=("harness", "torch"))
    return sorted(files)


def _module_digest(source: PatchSource, config: RunConfig) -> str:
    """Every file of the module under test's folder (or its one file), and what a cell's key
    holds of it besides (``CellInputs.module_digest``: the files outside it that it imports, its
    parent packages' ``__init__``, the patch mapping)."""
    root = source.path.resolve()
    own = [root] if root.is_file() else \
        sorted(f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return _digest(_files_digest(own), CellInputs(scenario_files={}, source=source,
                                                  patch_mapping=config.patch_mapping).module_digest)


def plan_key(config: RunConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The key of ``config``'s plan under ``environ`` (default: this process's environment now);
    None where some input cannot be read (the run plans, and says why)."""
    options = {k: v for k, v in config.to_json().items() if k not in _NOT_PLANNED}
    try:
        sources = [locate(spec) for spec in dict.fromkeys((config.patches, DEFAULT_MODULE))]
        modules = [_module_digest(source, config) for source in sources]
        return _digest(str(_FORMAT), json.dumps(options, sort_keys=True, default=str), _torch_build(), _installs(),
                       installed_code(tuple(str(source.path.resolve()) for source in sources)),
                       *(_machine(d) for d in sorted(set(config.devices))),
                       _environment(os.environ if environ is None else environ),
                       _harness_digest(), _files_digest(_scenario_files(config)), *modules)
    except (OSError, ValueError):
        return None


def load(out: Path, key: str | None) -> dict[str, Any] | None:
    """The plan saved under ``key`` for a run writing ``out``: its cells and what ``save`` kept
    beside them; None where there is none (or it cannot be read)."""
    if key is None:
        return None
    try:
        data = json.loads((folder(out) / f"{key}.json").read_text())
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        data["cells"] = [Cell.from_dict(c) for c in data["cells"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return data


def used(out: Path, key: str) -> None:
    """Mark the plan saved under ``key`` as just used (the newest ``KEEP`` are kept)."""
    with contextlib.suppress(OSError):
        os.utime(folder(out) / f"{key}.json")


def save(out: Path, key: str | None, cells: list[Cell], **beside: Any) -> None:
    """Keep ``cells`` (and the JSON values ``beside``) under ``key``; the oldest plans beyond
    ``KEEP`` go. Nothing is kept where the folder cannot be written."""
    if key is None:
        return
    where = folder(out)
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"key": key, "cells": [dataclasses.asdict(c) for c in cells], **beside}))
        tmp.replace(where / f"{key}.json")
        kept = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        return
