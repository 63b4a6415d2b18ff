"""One harness run, as a pipeline: check the request, load the scenarios, plan the cells,
launch them, return their records.

``ValueError`` (one line, naming the problem) for bad input, before anything starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.launch.incremental import known, reuse
from harness.launch.launcher import LaunchOptions, RunResult, run_cells
from harness.launch.outpath import prepare_out
from harness.launch.prestart import Prestarted
from harness.plan import saved
from harness.plan.cells import Cell, all_patch_names, plan_cells
from harness.plan.inputs import CellInputs
from harness.process import collector
from harness.results.outcome import CellOutcome
from harness.results.record import Record, append, finish, new_record
from harness.runconfig import RunConfig
from harness.undertest.source import PatchSource, check_patch_names, deployed_patches, locate, near_misses
from harness.vocabulary import DEFAULT_MODULE, Failure

if TYPE_CHECKING:  # loading scenarios imports torch: only a plan not saved before does (harness.plan.saved)
    from harness.scenario.load import LoadError

__all__ = ["Planned", "plan", "run"]


@dataclass(kw_only=True)
class Planned:
    """The cells a run configuration plans (``plan``), and what it could not load."""

    config: RunConfig
    cells: list[Cell]
    #: scenario files that failed to load (each is recorded as an error)
    broken: list[LoadError] = field(default_factory=list)
    #: how records name the module under test (``PatchSource.describe``)
    module_id: str = ""
    #: the module under test's folder (a package) or file: a reused record's code is checked against it
    module_path: Path | None = None
    #: near misses between the module's functions and the patch names (``near_misses``)
    warnings: list[str] = field(default_factory=list)
    #: the key to keep this plan under, where it was made from scratch (``harness.plan.saved``)
    to_save: str | None = None
    #: the key of the saved plan it was taken from (kept among the newest once the run may write)
    taken: str | None = None


def plan(config: RunConfig, *, saved_beside: Path | None = None) -> Planned:
    """The cells of ``config``, checked: ``ValueError`` (one line) for a bad request, before
    anything starts. Shared by ``harness run`` and the pytest plugin. ``saved_beside``: the
    records file of a run whose plan is kept (``harness.plan.saved``): the plan saved there with
    the same inputs is taken instead of planning (not under ``--fresh``); a new one is to be saved
    (``Planned.to_save``: ``run`` keeps it once it may write)."""
    if config.expect_torch:
        _check_torch(config.expect_torch)
    environ = dict(os.environ)  # as the run started: loading the hf_ scenarios sets their offline switches
    key = saved.plan_key(config, environ) if saved_beside is not None else None
    if key is not None and not config.fresh and (kept := saved.load(saved_beside, key)) is not None:
        path = kept.get("module_path")
        return Planned(config=config, cells=kept["cells"], module_id=kept.get("module_id", ""),
                       module_path=Path(path) if path else None, warnings=kept.get("warnings", []), taken=key)
    planned = _plan(config)
    # kept only where nothing it was made from moved while it was made (an edit meanwhile: the next run plans)
    planned.to_save = key if key is not None and not planned.broken and saved.plan_key(config, environ) == key else None
    return planned


def _save(planned: Planned, out: Path) -> None:
    """Keep a plan made from scratch beside ``out``, or mark the one taken as used (``harness.plan.saved``)."""
    if planned.to_save is not None:
        saved.save(out, planned.to_save, planned.cells, module_id=planned.module_id, warnings=planned.warnings,
                   module_path=str(planned.module_path) if planned.module_path else None)
    elif planned.taken is not None:
        saved.used(out, planned.taken)


def _plan(config: RunConfig) -> Planned:
    from harness.scenario.load import load_scenarios, select

    library = load_scenarios(config.scenario_dirs)
    broken = [e for e in library.errors if not config.scenarios or e.name in config.scenarios]
    wanted = [n for n in config.scenarios if n not in {e.name for e in broken}]
    chosen = select(library.scenarios, wanted) if wanted or not config.scenarios else []
    source = locate(config.patches)  # read, not imported: the workers import it under the watchdog
    check_patch_names({s.name: s.patches for s in chosen}, [source, *_own_module(config.patches)],
                      config.patch_mapping)
    vocabulary = all_patch_names(list(library.scenarios.values()))
    cells = [c for fault in config.faults or [None] for c in plan_cells(
        chosen, world_sizes=config.world_sizes or None, devices=config.devices, variants=config.variants,
        explicit_scenarios=bool(config.scenarios), timeout_s=config.timeout_s, fault=fault,
        deployed_patches=deployed_patches(vocabulary, source, config.patch_mapping), init=config.init)]
    inputs = CellInputs(scenario_files=_scenario_files(library.modules), source=source,
                        patch_mapping=config.patch_mapping, isolate=config.isolate)
    for i, c in enumerate(cells):
        c.index = i
        c.inputs, c.reference_inputs = inputs.key(c), inputs.reference_inputs(c)
    if not cells and not broken:
        raise ValueError("nothing to run: no scenario supports the chosen world sizes and devices")
    for ws in config.world_sizes if chosen else []:
        if not any(c.world_size == ws for c in cells):
            supported = sorted({w for s in chosen for w in s.world_sizes})
            raise ValueError(f"world size {ws}: no selected scenario supports it (supported: "
                             f"{', '.join(map(str, supported))})")
    for c in cells:
        if c.world_size % config.nnodes:
            raise ValueError(f"world size {c.world_size} is not divisible by --nnodes {config.nnodes} (cell {c.label})")
    return Planned(config=config, cells=cells, broken=broken, module_id=source.describe(), module_path=source.path,
                   warnings=near_misses(source, vocabulary, config.patch_mapping))


def run(config: RunConfig, *, on_start: Callable[[int, Path], None] | None = None,
        on_record: Callable[[Record, int], None] | None = None,
        on_load_error: Callable[[LoadError], None] | None = None,
        on_warning: Callable[[str], None] | None = None, prestarted: Prestarted | None = None,
        hold: Callable[[], None] | None = None) -> RunResult:
    """Plan, validate and run every cell of ``config``: their records, in the order written,
    and what a signal left unrun. A scenario file that fails to load is recorded (and
    reported through ``on_load_error``); the other scenarios run. ``prestarted``: a server
    started before this process imported torch, for the first CPU launch (``harness.launch.prestart``).
    ``hold``: called once planned and the reusable records read, before anything is written
    (``harness run --hold``: it returns when let go)."""
    planned = plan(config, saved_beside=config.records_file)
    for warning in planned.warnings if on_warning else []:
        on_warning(warning)
    cells, broken = planned.cells, planned.broken
    records = known(config, config.records_file)
    if hold is not None:
        hold()
    collector.settle()  # what ``python -m harness`` imported and planned, out of the collector's view
    _save(planned, config.records_file)
    total = len(cells) + len(broken)
    opts = LaunchOptions(config=config, patches_module_id=planned.module_id, prestarted=prestarted,
                         on_record=(lambda rec: on_record(rec, total)) if on_record else None)
    prepare_out(opts.out_path, opts.log_dir, config.reuse_from)
    failed_loads = [_load_error_record(e, opts) for e in broken]
    for e in broken:
        if on_load_error is not None:
            on_load_error(e)
    if on_start is not None:
        on_start(len(cells), opts.out_path)
    reused, cells = reuse(cells, config, opts.out_path, planned.module_path, records)
    for rec in reused if opts.on_record else []:
        opts.on_record(rec)
    result = run_cells(cells, opts) if cells else RunResult()
    result.records[:0] = [*failed_loads, *reused]
    return result


def _scenario_files(modules: dict[str, str]) -> dict[str, Path]:
    """Scenario name -> the file that defines it (its module, loaded by ``load_scenarios``)."""
    import sys

    files = {}
    for name, module in modules.items():
        file = getattr(sys.modules.get(module), "__file__", None)
        if file:
            files[name] = Path(file)
    return files


def _load_error_record(error: LoadError, opts: LaunchOptions) -> Record:
    """The record of a scenario file that failed to load (world size 0: it has no cells)."""
    config = opts.config
    cell = Cell(index=-1, scenario=error.name, variant="vanilla", device=config.devices[0], backend="", world_size=0,
                mesh=(), timeout_s=0.0, why="the scenario file must load")
    now = time.time()
    outcome = CellOutcome(status="error", exc_type=Failure.SCENARIO_LOAD_ERROR, exc_msg=f"scenario file failed to load: {error}")
    rec = new_record(cell, outcome, run_id=opts.run_id, launch_id="loader", patches_module=config.patches, t0=now)
    append(opts.out_path, finish(rec, now))
    if opts.on_record is not None:
        opts.on_record(rec)
    return rec


def _own_module(spec: str) -> list[PatchSource]:
    """The project's own patches module, whose names are known whatever module is under test."""
    if spec == DEFAULT_MODULE:
        return []
    try:
        return [locate(DEFAULT_MODULE)]
    except ValueError:
        return []


def _check_torch(wanted: str) -> None:
    """The installed torch is ``wanted``, its build label aside (``2.13.0+cpu`` is 2.13.0;
    ``2.16.0rc1`` is not 2.16.0)."""
    from importlib.metadata import version

    from packaging.version import InvalidVersion, Version

    from harness.versions import release

    installed = version("torch")
    try:
        same = release(installed) == Version(wanted)
    except InvalidVersion:
        same = False
    if not same:
        raise ValueError(f"installed torch {installed} is not the requested {wanted}")
