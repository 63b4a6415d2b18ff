"""Reproduce one cell locally: run it here, and optionally export it as a standalone script.

``repro`` returns the cell's record; ``format_report`` prints it the way a bug report
wants it: the verdict, the per-parameter diff table (worst first), the failing rank's
exception and traceback, and the exact command to rerun it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.launcher import LaunchOptions, run_cells
from harness.plan.cells import plan_cells
from harness.results.record import Record
from harness.runconfig import RunConfig
from harness.scenario.load import load_scenarios, select
from harness.scenario.spec import Scenario

__all__ = ["ReproRequest", "default_world_size", "format_report", "launch_hint", "repro"]


@dataclass(kw_only=True)
class ReproRequest:
    scenario: str
    world_size: int | None = None
    variant: str = "vanilla"
    device: str = "cpu"
    #: the patches module, its mapping, the timeout and the scenario folders (``RunConfig``'s)
    config: RunConfig = field(default_factory=RunConfig)
    #: also write a standalone script (needs only torch) here
    export: Path | None = None
    #: keep the record in ``config.out`` (JSON lines, appended); else in a temporary folder
    keep: bool = False


def default_world_size(scenario: Scenario) -> int:
    """2 where the scenario supports it, else its smallest."""
    return 2 if 2 in scenario.world_sizes else min(scenario.world_sizes)


def repro(req: ReproRequest) -> Record:
    """Run one cell in the current environment (and export it when asked); its record."""
    library = load_scenarios(req.config.scenario_dirs)
    (scenario,) = select(library.scenarios, [req.scenario])
    world = req.world_size or default_world_size(scenario)
    (cell,) = plan_cells([scenario], world_sizes=[world], devices=[req.device], variants=[req.variant],
                         explicit_scenarios=True, timeout_s=req.config.timeout_s)
    if req.export is not None:
        from harness.repro.export import export_script

        export_script(cell, library.modules[scenario.name], req.export, patches_module=req.config.patches,
                      patch_mapping=req.config.patch_mapping)
    with tempfile.TemporaryDirectory() as tmp:
        out = req.config.records_file if req.keep else Path(tmp) / "repro.jsonl"
        opts = LaunchOptions(config=req.config.with_(run_id="repro", out=out), log_dir=Path(tmp) / "logs")
        result = run_cells([cell], opts)
    if result.signal is not None:
        raise KeyboardInterrupt
    (rec,) = result.records
    return rec


def format_report(rec: Record, *, rerun: str) -> str:
    lines = [
        f"{rec.scenario} [{rec.variant}, {rec.device}/{rec.backend}, world size {rec.world_size}] torch {rec.torch}",
        f"verdict: {rec.status} (expected {'|'.join(rec.expected)}"
        f"{', as expected' if rec.as_expected else ', NOT as expected'})",
    ]
    if rec.reason:
        lines.append(f"note: {rec.reason}")
    diffs = [d for d in rec.diffs if d.get("kind") != "opt_state" or not d.get("ok")]
    if diffs:
        lines += ["", f"{'step':>4}  {'kind':<9} {'parameter':<28} {'max abs':>10} {'max rel':>10}  ok   note"]
        for d in diffs[:30]:  # records keep diffs worst first
            lines.append(f"{d['step']:>4}  {d['kind']:<9} {d['name']:<28} {_num(d.get('max_abs'))} "
                         f"{_num(d.get('max_rel'))}  {'yes' if d.get('ok') else 'NO ':<3}  {d.get('note') or ''}")
    if rec.exc_msg:
        lines += ["", f"exception on rank {rec.failing_rank}: {rec.exc_type}: {rec.exc_msg}"]
        if rec.traceback:
            lines += ["", rec.traceback.rstrip()]
    lines += ["", f"rerun: {rerun}"]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return f"{'-':>10}" if x is None else f"{x:10.3e}"


def launch_hint(path: Path, world: int) -> str:
    return f"python {path}" if world == 1 else f"torchrun --standalone --nproc-per-node {world} {path}"
