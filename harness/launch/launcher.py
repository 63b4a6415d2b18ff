"""Launch cells under torchrun, one launch per device, and account for every cell.

The workers record the cells they finish (``harness.rank.worker``); this process follows a launch's progress file
(cell starts, with their ranks) and the records file. A cell still open ``timeout_s + grace_s`` after its start (stuck
where the worker's own watchdog cannot reach) gets the launch killed and is recorded as a hang, with where each of its
ranks was and their threads' stacks; a launch that dies (a rank aborts) gets the cell on the dead rank recorded as a
crash. Cells that were running beside them, or not yet started, run in a new launch. Every process a launch starts is
reaped on every path (``harness.process.tree``): a normal end, a timeout, a crash, an exception in the harness, SIGINT
or SIGTERM; so is every process the code under test started, reparented ones included (this process is a child
subreaper while cells run). On a signal the run stops launching, reaps, and returns what finished; nothing writes to
the records file after that. What the launch's processes handed each other goes.

A rank that code under test ended (``os._exit`` in a patch) notes its exit code and phase;
its cell is recorded as a crash naming the rank, the code and the phase.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.launch import forkserver
from harness.launch.follow import LaunchFollower
from harness.launch.outpath import drop_handoff, prepare_out
from harness.launch.prestart import PROJECT_ROOT, Prestarted, launch_env, warm, worker_paths
from harness.plan.cells import Cell
from harness.plan.placement import group_into_launches, launch_world, stages
from harness.process import tree as procs
from harness.process.crashlog import crash_cause, exit_message, fatal_signal, tail
from harness.process.gpus import gpu_slice, skip_reason, visible_gpus, worker_slot
from harness.protocol import IDLE, LaunchPlan, phase_words, read_exit, read_phase
from harness.rank.watchdog import read_stacks
from harness.results import record
from harness.results.outcome import CellOutcome
from harness.runconfig import RunConfig
from harness.vocabulary import Failure

__all__ = ["LaunchOptions", "RunResult", "run_cells"]

@dataclass(kw_only=True)
class LaunchOptions:
    """How the launcher runs the cells of a run configuration: the configuration as it is,
    and what only the launch needs."""

    config: RunConfig
    #: how records name the module under test (``harness.undertest.source.PatchSource.describe``)
    patches_module_id: str = ""
    #: the launch folders' parent; None: ``<records file's stem>.logs`` beside the records file
    log_dir: Path | None = None
    python: str = sys.executable
    #: how long past a cell's deadline the launcher waits for the worker's own watchdog
    grace_s: float = 5.0
    #: how long a launch may take to start its first cell (imports, rendezvous)
    startup_timeout_s: float = 180.0
    on_record: Callable[[record.Record], None] | None = None
    #: folders the workers import from after the project's and the caller's ``PYTHONPATH``
    #: (``run_cells`` adds the one a dotted patches module was found under)
    python_path: list[str] = field(default_factory=list)
    #: a server started before the run planned, for its first CPU launch (``harness.launch.prestart``)
    prestarted: Prestarted | None = None

    def __post_init__(self) -> None:
        if self.log_dir is None:
            self.log_dir = self.out_path.parent / f"{self.out_path.stem}.logs"

    @property
    def run_id(self) -> str:
        assert self.config.run_id is not None  # set by RunConfig
        return self.config.run_id

    @property
    def out_path(self) -> Path:
        return self.config.records_file


@dataclass(kw_only=True)
class RunResult:
    records: list[record.Record] = field(default_factory=list)
    #: cells that did not run because the run was interrupted
    not_run: list[Cell] = field(default_factory=list)
    #: the signal that interrupted the run (SIGINT, SIGTERM), if any
    signal: int | None = None
    launches: int = 0


def run_cells(cells: list[Cell], opts: LaunchOptions) -> RunResult:
    """Run every cell; every cell ends with a record, unless a signal stops the run.
    ``ValueError`` when the records file or the launch folder cannot be written."""
    prepare_out(opts.out_path, opts.log_dir, opts.config.reuse_from)
    config, python_path = worker_paths(opts.config, opts.python_path)  # the workers run in the project's folder
    opts = replace(opts, config=config, python_path=python_path)
    result = RunResult()
    with procs.subreaper(), _stop_on_signals(result):
        for group in group_into_launches(cells, per=opts.config.per, isolate=opts.config.isolate):
            remaining = _skip_without_gpus(group, opts, result)
            while remaining and result.signal is None:
                remaining = _launch(remaining, opts, result)
                if remaining and opts.config.nnodes > 1:
                    if opts.config.node_rank == 0:
                        msg = "not run: the multi-node launch ended before this cell (no relaunch across nodes)"
                        for cell in remaining:
                            _accept(_outside(cell, opts, "error", time.time(), None, exc_msg=msg), result, opts)
                    remaining = []
    done = {r.cell for r in result.records}
    result.not_run = [c for c in cells if c.index not in done]
    return result


def _stop_on_signals(result: RunResult) -> contextlib.AbstractContextManager[None]:
    """SIGINT/SIGTERM set ``result.signal``; the launch loop then reaps and stops."""
    def stop(signum: int, frame: Any) -> None:
        result.signal = signum

    return procs.on_stop_signals(stop)


def _skip_without_gpus(group: list[Cell], opts: LaunchOptions, result: RunResult) -> list[Cell]:
    if group[0].device != "cuda":
        return group
    world = max(c.world_size for c in group) // opts.config.nnodes
    gpus = gpu_slice(visible_gpus(), *worker_slot(), world)
    keep = []
    for cell in group:
        reason = skip_reason("cuda", cell.world_size // opts.config.nnodes, gpus)
        if reason is None:
            keep.append(cell)
        else:
            _accept(_outside(cell, opts, "skip", time.time(), None, reason=reason, missing=f"{cell.world_size} GPUs"),
                    result, opts)
    return keep


def _launch(cells: list[Cell], opts: LaunchOptions, result: RunResult) -> list[Cell]:
    """One torchrun over ``cells``; returns the cells still to run."""
    world = launch_world(cells, opts.config.slots)
    result.launches += 1
    suffix = "" if opts.config.nnodes > 1 else f"-{uuid.uuid4().hex[:6]}"  # every node derives the same id
    launch_id = f"{opts.run_id}-L{result.launches}{suffix}"
    config = opts.config.with_(scenario_dirs=[str(Path(d).resolve()) for d in opts.config.scenario_dirs],
                               dump=opts.config.dump.resolve() if opts.config.dump else None)
    plan = LaunchPlan(
        config=config, run_id=opts.run_id, launch_id=launch_id, device=cells[0].device, world_size=world,
        patches_module_id=opts.patches_module_id, out_path=str(opts.out_path.resolve()),
        folder=str(opts.log_dir.resolve()), cells=cells,
        stages=stages(cells, world, shuffle=config.shuffle, isolate=config.isolate))
    plan_path, log_path = plan.dump(), plan.log_file
    watch = LaunchFollower(progress_path=plan.progress_file, out_path=opts.out_path, launch_id=launch_id)
    children_before = procs.children()
    proc = _start(plan, plan_path, log_path, opts, world)
    by_index = {c.index: c for c in cells}
    killed_for: Cell | None = None
    crashed: tuple[int, str, str] | None = None
    sessions: set[int] = set()  # the workers' sessions, for the sweep at the end
    try:
        if opts.config.node_rank != 0:
            proc.wait()  # rank 0 (on node 0) judges and records; this node only hosts ranks
            return []
        killed_for, crashed = _follow(proc, plan, log_path, watch, by_index, opts, result, sessions)
    finally:  # whatever happened, nothing of this launch outlives it, nor what the code under test started
        procs.end_launch(proc, known_sessions=sessions, children_before=children_before)
        drop_handoff(plan)
    for rec in watch.new_records():
        _accept(rec, result, opts)
    if result.signal is not None:
        return [c for c in cells if c.index not in watch.recorded]
    opened = {i: t for i, t in watch.starts.items() if i not in watch.recorded}
    if killed_for is not None:
        ranks = watch.ranks.get(killed_for.index, [])
        phases = "; ".join(f"rank {r} in {p!r}" for r in ranks if (p := read_phase(plan.stamp_file(r))))
        msg = (f"no result {killed_for.timeout_s:g} s + {opts.grace_s:g} s after the cell started; launch killed"
               + (f" ({phases})" if phases else ""))
        stacks = read_stacks({r: plan.stamp_file(r) for r in ranks})  # where each stuck rank's threads were
        _accept(_outside(killed_for, opts, "hang", opened.pop(killed_for.index), log_path, exc_msg=msg, stacks=stacks),
                result, opts)
    elif opened:
        crashed = crashed or _exited(plan, [r for i in opened for r in watch.ranks.get(i, [])])
        exc_type, msg, rank = crash_cause(log_path) if crashed is None else (crashed[1], crashed[2], crashed[0])
        if exc_type in (Failure.LAUNCH_ERROR, Failure.EXIT_CODE) and crashed is None:
            exc_type, msg, rank = _exit_in_phase(plan, proc.returncode, watch, opened, (exc_type, msg, rank))
        culprits = [i for i in opened if rank in watch.ranks.get(i, [])] or list(opened)
        for i in culprits:
            _accept(_outside(by_index[i], opts, "crash", opened[i], log_path, exc_type=exc_type, exc_msg=msg,
                             failing_rank=rank), result, opts)
    elif not watch.starts or not watch.recorded:
        # The launch recorded nothing (it failed before or between cells): say why once for
        # every cell, and do not loop.
        exc_type, msg, _ = crash_cause(log_path)
        for cell in cells:
            if cell.index not in watch.recorded:
                _accept(_outside(cell, opts, "error", time.time(), log_path, exc_type=exc_type,
                                 exc_msg=f"launch failed before the cell: {msg}"), result, opts)
    done = {r.cell for r in result.records}
    return [c for c in cells if c.index not in done]


def _exited(plan: LaunchPlan, ranks: list[int]) -> tuple[int, str, str] | None:
    """(rank, exc type, message) of the first of ``ranks`` that noted an exit by code under test."""
    for rank in sorted(set(ranks)):
        if (noted := read_exit(plan.exit_file(rank))) is not None:
            return rank, Failure.EXIT_CODE, exit_message(rank, noted.code, noted.phase)
    return None


def _exit_in_phase(plan: LaunchPlan, returncode: int | None, watch: LaunchFollower, opened: dict[int, float],
                   cause: tuple[str, str, int | None]) -> tuple[str, str, int | None]:
    """A launch that ended with a cell open and no error in its log: add where the rank was to
    torchrun's "rank R exited with code N"; or torchrun exited 0 (every rank exited 0)."""
    exc_type, msg, rank = cause
    if exc_type == Failure.EXIT_CODE and rank is not None and (phase := read_phase(plan.stamp_file(rank))) not in (None, IDLE):
        return exc_type, f"{msg} {phase_words(phase)}", rank
    ranks = [r for i in opened for r in watch.ranks.get(i, [])]
    busy = [(r, phase) for r in ranks if (phase := read_phase(plan.stamp_file(r))) not in (None, IDLE)]
    if exc_type == Failure.LAUNCH_ERROR and returncode == 0 and busy:
        return Failure.EXIT_CODE, exit_message(busy[0][0], 0, busy[0][1]), busy[0][0]
    return cause


def _follow(proc, plan: LaunchPlan, log_path: Path, watch: LaunchFollower, by_index: dict[int, Cell], opts: LaunchOptions,
            result: RunResult, sessions: set[int]) -> tuple[Cell | None, tuple[int, str, str] | None]:
    """Follow the launch until it exits, is interrupted, a rank dies of a fatal signal or is
    ended by code under test, or a cell overstays: (the cell it was killed for, (rank, exc
    type, message) of a dead rank). Notes the sessions of the launch's processes as it goes."""
    t0 = last = sampled = time.time()
    sessions |= procs.sessions(proc.pid)
    idle_s = max(c.timeout_s for c in by_index.values()) + 60  # no cell open, nothing new: a stuck launch
    cells, phase_files = set(by_index), [plan.phase_times_file(r) for r in range(plan.world_size)]
    while proc.poll() is None:
        for rec in watch.new_records():
            _accept(rec, result, opts)
            last = time.time()
        if result.signal is not None or watch.finished(cells, phase_files):
            return None, None  # finished: the processes' exit and torchrun's teardown are not waited for
        now = time.time()
        if now - sampled > 1.0:
            sessions |= procs.sessions(proc.pid)
            sampled = now
        open_cells = watch.open_cells()
        for index, start in open_cells.items():
            last = max(last, start)
            if now - start > by_index[index].timeout_s + opts.grace_s:
                return by_index[index], None
        if exited := _exited(plan, [r for i in open_cells for r in watch.ranks.get(i, [])]):
            return None, exited
        for rank in {r for i in open_cells for r in watch.ranks.get(i, [])}:
            if plan.crash_file(rank).stat().st_size if plan.crash_file(rank).exists() else 0:
                time.sleep(0.3)  # let the dying rank's C++ message reach the log
                return None, (rank, *(fatal_signal(plan.crash_file(rank), log_path, rank)
                                      or (Failure.SIGNAL, f"rank {rank} died of a fatal signal")))
        if not watch.starts and now - t0 > opts.startup_timeout_s:
            return None, None
        if watch.starts and not open_cells and now - last > idle_s:
            return None, None
        time.sleep(0.05)
    return None, None


def _start(plan: LaunchPlan, plan_path: Path, log_path: Path, opts: LaunchOptions, world: int):
    assert opts.config.nnodes == 1 or opts.config.rdzv_endpoint, "multi-node runs need a rendezvous endpoint"
    rdzv = ["--nnodes", str(opts.config.nnodes), "--node-rank", str(opts.config.node_rank), "--rdzv-endpoint",
            opts.config.rdzv_endpoint] if opts.config.nnodes > 1 else ["--standalone"]
    torchrun = [opts.python, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node", str(world // opts.config.nnodes)]
    worker_args = ["--plan", str(plan_path.resolve())]
    env = launch_env(opts.python_path)
    if (early := opts.prestarted) is not None and warm(plan.config, plan.device):
        log_path.write_text(f"$ (the server started before planning) {' '.join(torchrun)}\n")
        proc = early.hand(plan_path.resolve(), forkserver.command(plan, torchrun, worker_args, early.name), log_path, env)
        if proc is not None:
            return proc
    cmd = forkserver.command(plan, torchrun, worker_args)
    if plan.device == "cuda":  # NVML answers is_available(): a driver initialized before the zygote forks breaks its children
        env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_slice(visible_gpus(), *worker_slot(), world // opts.config.nnodes))
    log_path.write_text("$ " + " ".join(cmd) + "\n")
    for stale in (plan.slot_file(r, w) for r in range(world) for w in ("done", "quiet")):  # a rerun of this id's
        stale.unlink(missing_ok=True)
    return procs.start(cmd, env=env, cwd=PROJECT_ROOT, log=log_path)


def _accept(rec: record.Record, result: RunResult, opts: LaunchOptions) -> None:
    result.records.append(rec)
    if opts.on_record is not None:
        opts.on_record(rec)


def _outside(cell: Cell, opts: LaunchOptions, status: str, t0: float, log_path: Path | None, stacks: str = "",
             **fields: Any) -> record.Record:
    """A record written by the launcher for a cell its launch could not finish (traceback: ``stacks``, the log's tail)."""
    if log_path is not None:
        fields = {"log": str(log_path), "traceback": "\n\n".join(t for t in (stacks, tail(log_path, 60)) if t), **fields}
    rec = record.new_record(cell, CellOutcome(status=status, **fields), run_id=opts.run_id, launch_id="launcher",
                            patches_module=opts.config.patches, patches_module_id=opts.patches_module_id, t0=t0,
                            order_seed=opts.config.shuffle)
    record.append(opts.out_path, record.finish(rec, t0))
    return rec
