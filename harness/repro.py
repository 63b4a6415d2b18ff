"""Reproduce one cell locally: ``python -m harness repro SCENARIO [...]``.

Runs the cell in the current environment and prints the verdict, the per-parameter diff
table (worst first), the failing rank's traceback and the exact command to rerun it.
``--export repro.py`` also writes a standalone script (see ``harness.export``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["add_repro_args", "cmd_repro", "format_report"]


def add_repro_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario")
    p.add_argument("--world-size", type=int, default=None, help="default: 2 where supported, else the smallest")
    p.add_argument("--variant", choices=["vanilla", "patched"], default="vanilla")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--patches", default="fsdp_patches")
    p.add_argument("--patch-map", action="append", default=[], metavar="NAME=FUNC")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--scenarios-dir", action="append", default=[])
    p.add_argument("--export", default=None, metavar="PATH", help="also write a standalone script that needs only torch")
    p.add_argument("--out", default=None, help="keep the record in this file (JSON lines, appended)")


def cmd_repro(args: argparse.Namespace) -> int:
    from harness.cli import _parse_mapping
    from harness.launch import LaunchOptions, run_cells
    from harness.patching import load_patches_module
    from harness.plan import plan_cells
    from harness.registry import load_scenarios, select

    scenarios = load_scenarios(args.scenarios_dir)
    (scenario,) = select(scenarios, [args.scenario])
    world = args.world_size or (2 if 2 in scenario.world_sizes else min(scenario.world_sizes))
    if args.variant == "patched":
        load_patches_module(args.patches)
    cells = plan_cells([scenario], world_sizes=[world], devices=[args.device], variants=[args.variant],
                       explicit_scenarios=True, timeout_s=args.timeout)
    if args.export:
        from harness.export import export_script

        path = export_script(scenario, cells[0], Path(args.export), patches_module=args.patches)
        print(f"wrote {path} (needs only torch): {_launch_hint(path, world)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "repro.jsonl"
        opts = LaunchOptions(run_id="repro", out_path=out, log_dir=Path(tmp) / "logs", patches_module=args.patches,
                             patch_mapping=_parse_mapping(args.patch_map), scenario_dirs=args.scenarios_dir)
        (rec,) = run_cells(cells, scenarios, opts)
    print(format_report(rec, rerun=_rerun_command(args, world)))
    return 0 if rec.get("as_expected") else 1


def format_report(rec: dict[str, Any], *, rerun: str) -> str:
    lines = [
        f"{rec['scenario']} [{rec['variant']}, {rec['device']}/{rec['backend']}, world size {rec['world_size']}] "
        f"torch {rec['torch']}",
        f"verdict: {rec['status']} (expected {rec['expected']}{', as expected' if rec.get('as_expected') else ', NOT as expected'})",
    ]
    if rec.get("reason"):
        lines.append(f"note: {rec['reason']}")
    diffs = [d for d in rec.get("diffs") or [] if d.get("kind") != "opt_state" or not d.get("ok")]
    if diffs:
        lines += ["", f"{'step':>4}  {'kind':<9} {'parameter':<28} {'max abs':>10} {'max rel':>10}  ok   note"]
        for d in diffs[:30]:  # records keep diffs worst first
            lines.append(
                f"{d['step']:>4}  {d['kind']:<9} {d['name']:<28} {_num(d.get('max_abs'))} {_num(d.get('max_rel'))}  "
                f"{'yes' if d.get('ok') else 'NO ':<3}  {d.get('note') or ''}"
            )
    if rec.get("exc_msg"):
        rank = rec.get("failing_rank")
        lines += ["", f"exception on rank {rank}: {rec.get('exc_type')}: {rec['exc_msg']}"]
        if rec.get("traceback"):
            lines += ["", rec["traceback"].rstrip()]
    lines += ["", f"rerun: {rerun}"]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return f"{'-':>10}" if x is None else f"{x:10.3e}"


def _rerun_command(args: argparse.Namespace, world: int) -> str:
    parts = [sys.executable, "-m", "harness", "repro", args.scenario, "--world-size", str(world),
             "--variant", args.variant, "--device", args.device]
    if args.variant == "patched" or args.patches != "fsdp_patches":
        parts += ["--patches", args.patches]
    for item in args.patch_map:
        parts += ["--patch-map", item]
    for d in args.scenarios_dir:
        parts += ["--scenarios-dir", d]
    return " ".join(shlex.quote(p) for p in parts)


def _launch_hint(path: Path, world: int) -> str:
    if world == 1:
        return f"python {path}"
    return f"torchrun --standalone --nproc-per-node {world} {path}"
