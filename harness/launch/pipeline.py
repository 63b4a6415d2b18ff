"""One harness run, as a pipeline: check the request, load the scenarios, plan the cells,
launch them, return their records.

``ValueError`` (one line, naming the problem) for bad input, before anything starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.launcher import LaunchOptions, RunResult, run_cells
from harness.launch.outpath import prepare_out
from harness.plan.cells import Cell, all_patch_names, plan_cells
from harness.results.record import Record, append, finish, new_record
from harness.scenario.load import LoadError, load_scenarios, select
from harness.undertest.source import PatchSource, check_patch_names, deployed_patches, locate, near_misses
from harness.vocabulary import DEFAULT_MODULE, VARIANTS, Failure

__all__ = ["RunRequest", "run"]


@dataclass(kw_only=True)
class RunRequest:
    scenarios: list[str] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    patches: str = DEFAULT_MODULE
    patch_mapping: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    scenario_dirs: list[str] = field(default_factory=list)
    isolate: str = "snapshot"
    #: faults to inject (``harness.train.faults``): each plans the cells documented to pass once more
    faults: list[str] = field(default_factory=list)
    #: "device": one launch per device (smaller world sizes on slots); "world-size": one per size
    per: str = "device"
    dump: Path | None = None
    expect_torch: str | None = None
    run_id: str
    out: Path
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    #: run the cells in a random order from this seed (``harness.plan.placement.stages``)
    shuffle: int | None = None
    #: "meta": every model built on the meta device (``harness.train.meta_init``)
    init: str = "full"


def run(req: RunRequest, *, on_start: Callable[[int, Path], None] | None = None,
        on_record: Callable[[Record, int], None] | None = None,
        on_load_error: Callable[[LoadError], None] | None = None,
        on_warning: Callable[[str], None] | None = None) -> RunResult:
    """Plan, validate and run every cell of ``req``: their records, in the order written,
    and what a signal left unrun. A scenario file that fails to load is recorded (and
    reported through ``on_load_error``); the other scenarios run."""
    if req.expect_torch:
        _check_torch(req.expect_torch)
    library = load_scenarios(req.scenario_dirs)
    broken = [e for e in library.errors if not req.scenarios or e.name in req.scenarios]
    wanted = [n for n in req.scenarios if n not in {e.name for e in broken}]
    chosen = select(library.scenarios, wanted) if wanted or not req.scenarios else []
    source = locate(req.patches)  # read, not imported: the workers import it under the watchdog
    check_patch_names({s.name: s.patches for s in chosen}, [source, *_own_module(req.patches)], req.patch_mapping)
    vocabulary = all_patch_names(list(library.scenarios.values()))
    for warning in near_misses(source, vocabulary, req.patch_mapping) if on_warning else []:
        on_warning(warning)
    cells = [c for fault in req.faults or [None] for c in plan_cells(
        chosen, world_sizes=req.world_sizes or None, devices=req.devices, variants=req.variants,
        explicit_scenarios=bool(req.scenarios), timeout_s=req.timeout_s, fault=fault,
        deployed_patches=deployed_patches(vocabulary, source, req.patch_mapping), init=req.init)]
    for i, c in enumerate(cells):
        c.index = i
    if not cells and not broken:
        raise ValueError("nothing to run: no scenario supports the chosen world sizes and devices")
    for ws in req.world_sizes if chosen else []:
        if not any(c.world_size == ws for c in cells):
            supported = sorted({w for s in chosen for w in s.world_sizes})
            raise ValueError(f"world size {ws}: no selected scenario supports it (supported: "
                             f"{', '.join(map(str, supported))})")
    _check_nodes(req, cells)
    opts = LaunchOptions(
        run_id=req.run_id, out_path=req.out, log_dir=req.out.parent / f"{req.out.stem}.logs",
        patches_module=req.patches, patches_module_id=source.describe(), patch_mapping=req.patch_mapping,
        scenario_dirs=req.scenario_dirs,
        on_record=(lambda rec: on_record(rec, len(cells) + len(broken))) if on_record else None, dump_dir=req.dump,
        isolate=req.isolate, per=req.per, shuffle=req.shuffle, nnodes=req.nnodes, node_rank=req.node_rank,
        rdzv_endpoint=req.rdzv_endpoint,
    )
    prepare_out(req.out, opts.log_dir)
    failed_loads = [_load_error_record(e, req, opts) for e in broken]
    for e in broken:
        if on_load_error is not None:
            on_load_error(e)
    if on_start is not None:
        on_start(len(cells), req.out)
    result = run_cells(cells, opts) if cells else RunResult()
    result.records[:0] = failed_loads
    return result


def _load_error_record(error: LoadError, req: RunRequest, opts: LaunchOptions) -> Record:
    """The record of a scenario file that failed to load (world size 0: it has no cells)."""
    cell = Cell(index=-1, scenario=error.name, variant="vanilla", device=req.devices[0], backend="", world_size=0,
                mesh=(), timeout_s=0.0, why="the scenario file must load")
    now = time.time()
    rec = new_record(cell, run_id=req.run_id, launch_id="loader", patches_module=req.patches, t0=now, status="error",
                     exc_type=Failure.SCENARIO_LOAD_ERROR, exc_msg=f"scenario file failed to load: {error}")
    append(req.out, finish(rec, now))
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


def _check_nodes(req: RunRequest, cells: list[Cell]) -> None:
    for c in cells:
        if c.world_size % req.nnodes:
            raise ValueError(f"world size {c.world_size} is not divisible by --nnodes {req.nnodes} (cell {c.label})")
