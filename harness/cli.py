"""Command line: ``python -m harness list|run|report``.

Bad input (unknown scenario, unsupported world size, bad device, missing patches module)
gets one line on stderr and exit code 2. ``run`` exits 1 when a cell's outcome is not
the expected one, 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

EXIT_UNEXPECTED = 1
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description="FSDP2 patch compatibility harness")
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="list the scenarios")
    ls.add_argument("--scenarios-dir", action="append", default=[], help="extra folder of scenario files")
    ls.set_defaults(func=_cmd_list)

    run = sub.add_parser("run", help="run scenario cells under torchrun and judge them")
    _add_run_args(run)
    run.set_defaults(func=_cmd_run)

    rp = sub.add_parser("repro", help="reproduce one cell here; --export writes a standalone script")
    from harness.repro import add_repro_args, cmd_repro

    add_repro_args(rp)
    rp.set_defaults(func=cmd_repro)

    rep = sub.add_parser("report", help="build reports/compat.{md,html,csv} from records")
    rep.add_argument("--records", nargs="+", default=["runs"], help="record files or folders")
    rep.add_argument("--out", default="reports")
    rep.set_defaults(func=_cmd_report)
    return p


def _add_run_args(run: argparse.ArgumentParser) -> None:
    run.add_argument("--scenario", action="append", default=[], help="scenario name (repeatable; default: all)")
    run.add_argument("--world-size", action="append", type=int, default=[], help="world size (repeatable)")
    run.add_argument("--device", action="append", default=[], help="cpu or cuda (repeatable; default cpu)")
    run.add_argument("--variant", action="append", default=[], help="vanilla or patched (repeatable; default both)")
    run.add_argument("--out", default=None, help="records file (JSON lines, appended); default runs/<run id>.jsonl")
    run.add_argument("--patches", default="fsdp_patches", help="patches module under test: dotted name or .py path")
    run.add_argument("--patch-map", action="append", default=[], metavar="NAME=FUNC", help="map a patch name to a function of the module")
    run.add_argument("--timeout", type=float, default=None, help="per-cell timeout in seconds for scenarios that set none (default 30)")
    run.add_argument("--scenarios-dir", action="append", default=[], help="extra folder of scenario files")
    run.add_argument("--isolate", choices=["snapshot", "process"], default="snapshot",
                     help="patch sets share a launch and are undone in turn (snapshot), or get launches of their own")
    run.add_argument("--dump", default=None, help="save each judged cell's observed tensors in this folder")
    run.add_argument("--expect-torch", default=None, metavar="X.Y.Z",
                     help="stop (exit 2) unless the installed torch is this release")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    node = run.add_argument_group("multi-node (passed to torchrun; run the same command on every node)")
    node.add_argument("--nnodes", type=int, default=1)
    node.add_argument("--node-rank", type=int, default=0)
    node.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT")
    node.add_argument("--run-id", default=None, help="the same on every node (default: a timestamp)")


def _cmd_list(args: argparse.Namespace) -> int:
    from harness.registry import load_scenarios

    for s in load_scenarios(args.scenarios_dir).values():
        sizes = ",".join(str(w) for w in s.world_sizes)
        patches = ",".join(s.patches) or "-"
        print(f"{s.name:<28} w={sizes:<7} devices={','.join(s.devices):<9} patches={patches:<48} {s.summary}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    records = run_from_args(args)
    _print_summary(records)
    unexpected = [r for r in records if not r.get("as_expected")]
    return EXIT_UNEXPECTED if unexpected else 0


def run_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Plan, validate and run; raises ValueError for bad input before anything starts."""
    from harness.launch import LaunchOptions, run_cells
    from harness.patching import load_patches_module
    from harness.plan import all_patch_names, plan_cells
    from harness.registry import load_scenarios, select

    if args.expect_torch:
        _check_torch(args.expect_torch)
    scenarios = load_scenarios(args.scenarios_dir)
    chosen = select(scenarios, args.scenario)
    mapping = _parse_mapping(args.patch_map)
    variants = args.variant or ["vanilla", "patched"]
    if "patched" in variants:
        load_patches_module(args.patches)  # fail early, in one line, if it cannot be imported
    cells = plan_cells(
        chosen,
        world_sizes=args.world_size or None,
        devices=args.device or ["cpu"],
        variants=variants,
        explicit_scenarios=bool(args.scenario),
        timeout_s=args.timeout,
        baseline_patches=all_patch_names(list(scenarios.values())),
    )
    if not cells:
        raise ValueError("nothing to run: no scenario supports the chosen world sizes and devices")
    _check_nodes(args, cells)
    run_id = args.run_id or datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"{run_id}.jsonl"
    progress = _Progress(total=len(cells), quiet=args.quiet)
    opts = LaunchOptions(
        run_id=run_id,
        out_path=out,
        log_dir=out.parent / f"{out.stem}.logs",
        patches_module=args.patches,
        patch_mapping=mapping,
        scenario_dirs=args.scenarios_dir,
        on_record=progress,
        dump_dir=Path(args.dump) if args.dump else None,
        isolate=args.isolate,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
    )
    if not args.quiet:
        print(f"{len(cells)} cells -> {out}", flush=True)
    return run_cells(cells, scenarios, opts)


def _check_torch(wanted: str) -> None:
    from importlib.metadata import version

    from harness.spec import torch_release

    installed = version("torch")
    if str(torch_release(installed)) != wanted:
        raise ValueError(f"installed torch {installed} is not the requested {wanted}")


def _check_nodes(args: argparse.Namespace, cells) -> None:
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in [0, {args.nnodes}) with --nnodes {args.nnodes}")
    if args.nnodes == 1:
        return
    if not args.rdzv_endpoint or not args.run_id:
        raise ValueError("multi-node runs need --rdzv-endpoint HOST:PORT and the same --run-id on every node")
    for c in cells:
        if c.world_size % args.nnodes:
            raise ValueError(f"world size {c.world_size} is not divisible by --nnodes {args.nnodes} (cell {c.label})")


def _parse_mapping(items: list[str]) -> dict[str, str]:
    mapping = {}
    for item in items:
        name, sep, func = item.partition("=")
        if not sep or not name or not func:
            raise ValueError(f"--patch-map expects NAME=FUNCTION, got {item!r}")
        mapping[name] = func
    return mapping


class _Progress:
    def __init__(self, *, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.n, self.t0 = total, quiet, 0, time.time()

    def __call__(self, rec: dict[str, Any]) -> None:
        self.n += 1
        if self.quiet:
            return
        flag = "" if rec.get("as_expected") else "  << UNEXPECTED (expected " + str(rec.get("expected")) + ")"
        detail = rec.get("exc_msg") or rec.get("worst") or rec.get("reason") or ""
        label = f"{rec['scenario']}[{rec['variant']},{rec['device']},w{rec['world_size']}]"
        print(
            f"[{self.n}/{self.total}, {self.total - self.n} left, {time.time() - self.t0:5.1f}s] {label:<52} {rec['status']:<8} "
            f"{rec.get('duration_s') or 0:5.2f}s  {str(detail)[:90]}{flag}",
            flush=True,
        )


def _print_summary(records: list[dict[str, Any]]) -> None:
    if not records:
        return
    print()
    header = f"{'scenario':<30} {'variant':<8} {'device':<6} {'ws':>2}  {'status':<8} {'expected':<16} ok  detail"
    print(header)
    print("-" * len(header))
    for r in sorted(records, key=lambda r: (r["scenario"], r["variant"] != "vanilla", r["device"], r["world_size"])):
        detail = r.get("exc_msg") or (f"max|diff| {r['max_abs_diff']:.2e} at {r['worst']}" if r.get("max_abs_diff") is not None else "") or r.get("reason") or ""
        ok = "yes" if r.get("as_expected") else "NO"
        print(
            f"{r['scenario']:<30} {r['variant']:<8} {r['device']:<6} {r['world_size']:>2}  {r['status']:<8} "
            f"{r['expected']:<16} {ok:<3} {str(detail)[:100]}"
        )
    unexpected = sum(1 for r in records if not r.get("as_expected"))
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"\n{len(records)} cells: {summary}; {unexpected} not as expected")


def _cmd_report(args: argparse.Namespace) -> int:
    from harness.report import main as report_main

    return report_main(["--records", *args.records, "--out", args.out])
