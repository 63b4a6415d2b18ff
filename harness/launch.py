"""Launch cells under torchrun, many cells per launch, with a per-cell watchdog.

One launch per group of compatible cells (``harness.plan.group_into_launches``). The
worker's rank 0 marks each cell's start in a progress file and appends its record when
done; this process watches both. A cell still running ``timeout_s + grace`` after its
start is a hang: the whole launch (its process group) is killed, the cell recorded, and
a new launch runs the cells after it. A launch that dies mid-cell (``os.abort()``, a
segfault) gets the cell recorded as a crash, and the rest relaunched likewise.

``torchrun --standalone`` picks a free rendezvous port per launch, so launches in
parallel processes (pytest-xdist workers) never collide.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import record
from harness.crashlog import crash_cause, tail
from harness.gpus import gpu_slice, skip_reason, visible_gpus, worker_slot
from harness.plan import Cell, LaunchPlan, group_into_launches

__all__ = ["LaunchOptions", "run_cells"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(kw_only=True)
class LaunchOptions:
    run_id: str
    out_path: Path
    log_dir: Path
    patches_module: str = "fsdp_patches"
    patches_module_id: str = ""
    patch_mapping: dict[str, str] = field(default_factory=dict)
    scenario_dirs: list[str] = field(default_factory=list)
    #: save each passing-or-mismatching cell's observed tensors here (``torch.save``)
    dump_dir: Path | None = None
    python: str = sys.executable
    #: multi-node: every node runs this launcher with the same cells and ``run_id``; node 0
    #: (global rank 0) writes the records. Launches are not repeated across nodes: after a
    #: hang or crash node 0 records the cells that did not run.
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    #: "snapshot": patch sets share a launch and are undone in turn; "process": a launch per set
    isolate: str = "snapshot"
    grace_s: float = 5.0
    #: how long a launch may take to start its first cell (imports, rendezvous)
    startup_timeout_s: float = 180.0
    on_record: Callable[[record.Record], None] | None = None


def run_cells(cells: list[Cell], opts: LaunchOptions) -> list[record.Record]:
    """Run every cell; return their records in the order they were written."""
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    opts.out_path.parent.mkdir(parents=True, exist_ok=True)
    opts.out_path.touch()
    records: list[dict[str, Any]] = []
    counter = 0
    for group in group_into_launches(cells, isolate=opts.isolate):
        first = group[0]
        env: dict[str, str] = {}
        if first.device == "cuda":
            gpus = gpu_slice(visible_gpus(), *worker_slot(), first.world_size // opts.nnodes)
            reason = skip_reason("cuda", first.world_size // opts.nnodes, gpus)
            if reason is not None:
                for cell in group:
                    _accept(_outside_record(cell, opts, "skip", time.time(), None, reason=reason), records, opts)
                continue
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        remaining = group
        while remaining:
            counter += 1
            # every node must derive the same launch id (it prefixes the store keys)
            suffix = "" if opts.nnodes > 1 else f"-{uuid.uuid4().hex[:6]}"
            launch_id = f"{opts.run_id}-L{counter}{suffix}"
            remaining = _launch(remaining, opts, launch_id, records, env)
            if opts.nnodes > 1:
                if opts.node_rank == 0:
                    for cell in remaining:
                        msg = "not run: the multi-node launch ended before this cell (no relaunch across nodes)"
                        _accept(_outside_record(cell, opts, "error", time.time(), None, exc_msg=msg), records, opts)
                remaining = []
    return records


def _launch(
    cells: list[Cell], opts: LaunchOptions, launch_id: str, records: list,
    extra_env: dict[str, str],
) -> list[Cell]:
    """One torchrun over ``cells``; returns the cells still to run."""
    first = cells[0]
    plan = LaunchPlan(
        run_id=opts.run_id,
        launch_id=launch_id,
        device=first.device,
        world_size=first.world_size,
        patches_module=opts.patches_module,
        patches_module_id=opts.patches_module_id,
        patch_mapping=opts.patch_mapping,
        out_path=str(opts.out_path.resolve()),
        progress_path=str((opts.log_dir / f"{launch_id}.progress").resolve()),
        scenario_dirs=[str(Path(d).resolve()) for d in opts.scenario_dirs],
        dump_dir=str(opts.dump_dir.resolve()) if opts.dump_dir else None,
        cells=cells,
    )
    plan_path = opts.log_dir / f"{launch_id}.json"
    plan.dump(plan_path)
    Path(plan.progress_path).write_text("")
    log_path = opts.log_dir / f"{launch_id}.log"
    offset = opts.out_path.stat().st_size
    proc = _start(plan, plan_path, log_path, opts, extra_env)
    watch = _Watch(plan=plan, out_path=opts.out_path, offset=offset)
    by_index = {c.index: c for c in cells}
    launch_t0 = time.time()
    killed_for: Cell | None = None
    if opts.node_rank != 0:
        proc.wait()  # rank 0 (on node 0) judges and records; this node only hosts ranks
        return []
    while True:
        exited = proc.poll() is not None
        for rec in watch.new_records():
            _accept(rec, records, opts)
        current = watch.current()
        now = time.time()
        if exited:
            break
        if current is not None:
            cell = by_index[current[0]]
            if now - current[1] > cell.timeout_s + opts.grace_s:
                killed_for = cell
                _kill(proc)
                break
        elif not watch.started and now - launch_t0 > opts.startup_timeout_s:
            _kill(proc)
            break
        time.sleep(0.05)
    proc.wait()
    for rec in watch.new_records():
        _accept(rec, records, opts)
    done = watch.recorded
    started = watch.started
    unfinished = [c for c in cells if c.index in started and c.index not in done]
    if killed_for is not None:
        t = watch.start_time(killed_for.index)
        msg = f"no result {killed_for.timeout_s:g} s + {opts.grace_s:g} s after the cell started; launch killed"
        _accept(_outside_record(killed_for, opts, "hang", t, log_path, exc_msg=msg), records, opts)
        done.add(killed_for.index)
    for cell in unfinished:
        if cell.index in done:
            continue
        exc_type, msg, rank = crash_cause(log_path)
        rec = _outside_record(cell, opts, "crash", watch.start_time(cell.index), log_path, exc_type=exc_type,
                              exc_msg=msg, failing_rank=rank)
        _accept(rec, records, opts)
        done.add(cell.index)
    if not started:
        # The launch never reached a cell: record why once for all of them, do not loop.
        exc_type, msg, _ = crash_cause(log_path)
        for cell in cells:
            rec = _outside_record(cell, opts, "error", time.time(), log_path, exc_type=exc_type,
                                  exc_msg=f"launch failed before the cell: {msg}")
            _accept(rec, records, opts)
        return []
    return [c for c in cells if c.index not in done]


def _start(
    plan: LaunchPlan, plan_path: Path, log_path: Path, opts: LaunchOptions, extra_env: dict[str, str]
) -> subprocess.Popen:
    if opts.nnodes > 1:
        assert opts.rdzv_endpoint, "multi-node runs need a rendezvous endpoint"
        rdzv = ["--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank), "--rdzv-endpoint", opts.rdzv_endpoint]
    else:
        rdzv = ["--standalone"]
    cmd = [
        opts.python, "-m", "torch.distributed.run", *rdzv,
        "--nproc-per-node", str(plan.world_size // opts.nnodes),
        "-m", "harness.worker", "--plan", str(plan_path.resolve()),
    ]  # fmt: skip
    env = {**os.environ, **extra_env}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    log = open(log_path, "w")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=PROJECT_ROOT)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Watch:
    """Follows a launch's progress file and the new lines of the records file."""

    def __init__(self, *, plan: LaunchPlan, out_path: Path, offset: int) -> None:
        self.plan = plan
        self.out_path = out_path
        self.offset = offset
        self.progress_offset = 0
        self.starts: dict[int, float] = {}
        self.recorded: set[int] = set()
        self._buffer = ""

    @property
    def started(self) -> set[int]:
        self._read_progress()
        return set(self.starts)

    def start_time(self, index: int) -> float:
        return self.starts.get(index, time.time())

    def current(self) -> tuple[int, float] | None:
        self._read_progress()
        open_cells = [(i, t) for i, t in self.starts.items() if i not in self.recorded]
        return max(open_cells, key=lambda x: x[1], default=None)

    def _read_progress(self) -> None:
        with open(self.plan.progress_path, encoding="utf-8") as f:
            f.seek(self.progress_offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.progress_offset += len(complete.encode())
        for line in complete.splitlines():
            event = json.loads(line)
            if event["event"] == "start":
                self.starts[event["cell"]] = event["t"]

    def new_records(self) -> list[record.Record]:
        with open(self.out_path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        out = []
        for line in complete.decode("utf-8").splitlines():
            try:
                rec = record.Record.from_json(line)
            except record.RecordError:
                continue
            if rec.launch_id == self.plan.launch_id:
                self.recorded.add(rec.cell)
                out.append(rec)
        return out


def _accept(rec: record.Record, records: list, opts: LaunchOptions) -> None:
    records.append(rec)
    if opts.on_record is not None:
        opts.on_record(rec)


def _outside_record(cell: Cell, opts: LaunchOptions, status: str, t0: float, log_path: Path | None,
                    **fields: Any) -> record.Record:
    """A record written by the launcher for a cell its launch could not finish."""
    if log_path is not None:
        fields.update(log=str(log_path), traceback=tail(log_path, 60))
    rec = record.new_record(cell, run_id=opts.run_id, launch_id="launcher", patches_module=opts.patches_module,
                            patches_module_id=opts.patches_module_id,
                            t0=t0, status=status, **fields)
    record.append(opts.out_path, record.finish(rec, t0))
    return rec
