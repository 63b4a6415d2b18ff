"""Launch benchmark, measured side by side in one run on the installed torch. Prints every figure.

(a) vs (b): the same small cells, one torchrun per cell vs all in one torchrun.
(c) vs (d): the whole CPU suite without the Hugging Face pack (every variant, world sizes
            1, 2, 4), one launch per world size (the older plan) vs one launch per device
            (the default: smaller world sizes on slots of its ranks, abort-prone cells in
            forked processes).
(e):        the whole CPU suite with the Hugging Face pack (default plan); ratio (e)/(d).
(f):        what a hung cell costs: a launch with a cell that hangs vs the same launch without it.

    python bench/launch_bench.py [--parts ab,cd,e,f] [--repeat 3]
    nox -s bench -- --parts cd,e
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.launch.launcher import LaunchOptions, run_cells  # noqa: E402
from harness.launch.pipeline import RunRequest, run  # noqa: E402
from harness.plan.cells import plan_cells  # noqa: E402
from harness.results.record import Record  # noqa: E402
from harness.scenario.load import load_scenarios  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001 (figures show as they are measured)

BASELINE = ["plain", "cpu_offload", "mixed_precision", "hsdp"]
FAULTS = ROOT / "tests" / "fixtures" / "scenarios"


def _timed_suite(folder: Path, name: str, scenarios: list[str], per: str) -> tuple[float, list[Record]]:
    req = RunRequest(scenarios=scenarios, run_id=name, out=folder / f"{name}.jsonl", per=per)
    t0 = time.perf_counter()
    result = run(req)
    return time.perf_counter() - t0, result.records


def _summary(records: list[Record]) -> str:
    bad = sum(1 for r in records if not r.as_expected)
    return f"{len(records)} cells, {bad} not as expected"


def part_ab(folder: Path, repeat: int) -> None:
    scenarios = load_scenarios().scenarios
    cells = plan_cells([scenarios[n] for n in BASELINE] * repeat, world_sizes=[2], devices=["cpu"],
                       variants=["vanilla"], explicit_scenarios=True)
    for i, c in enumerate(cells):
        c.index = i

    def timed(name: str, batches: list[list]) -> tuple[float, list[Record]]:
        opts = LaunchOptions(run_id=name, out_path=folder / f"{name}.jsonl", log_dir=folder / f"{name}.logs")
        t0 = time.perf_counter()
        records = [r for batch in batches for r in run_cells(batch, opts).records]
        return time.perf_counter() - t0, records

    per_cell, rec_a = timed("per-cell", [[c] for c in cells])
    amortized, rec_b = timed("amortized", [cells])
    print(f"(a) one torchrun per cell      : {per_cell:7.1f} s  {per_cell / len(cells):.2f} s/cell  ({_summary(rec_a)})")
    print(f"(b) all cells in one torchrun  : {amortized:7.1f} s  {amortized / len(cells):.2f} s/cell  ({_summary(rec_b)})")
    print(f"    ratio (a)/(b)              : {per_cell / amortized:7.2f}x")


def _cpu_scenarios() -> tuple[list[str], list[str]]:
    """(the CPU scenarios without the HF pack, all CPU scenarios)."""
    names = sorted(n for n, s in load_scenarios().scenarios.items() if "cpu" in s.devices)
    return [n for n in names if not n.startswith("hf_")], names


def part_cde(folder: Path, *, older_plan: bool, with_hf: bool) -> None:
    """(d), and beside it (c) the older plan on the same cells and/or (e) the suite with the HF pack."""
    core, names = _cpu_scenarios()
    if older_plan:
        old, rec_c = _timed_suite(folder, "per-world-size", core, "world-size")
        print(f"(c) suite, launch per world size: {old:7.1f} s  ({_summary(rec_c)})")
    new, rec_d = _timed_suite(folder, "per-device", core, "device")
    print(f"(d) suite, launch per device    : {new:7.1f} s  ({_summary(rec_d)})")
    if older_plan:
        print(f"    ratio (c)/(d)               : {old / new:7.2f}x")
    if with_hf:
        full, rec_e = _timed_suite(folder, "with-hf", names, "device")
        print(f"(e) suite with the HF pack      : {full:7.1f} s  ({_summary(rec_e)})")
        print(f"    ratio (e)/(d)               : {full / new:7.2f}x")


def part_f(folder: Path) -> None:
    def timed(name: str, scenarios: list[str]) -> tuple[float, list[Record]]:
        req = RunRequest(scenarios=scenarios, run_id=name, out=folder / f"{name}.jsonl", variants=["vanilla"],
                         scenario_dirs=[str(FAULTS)])
        t0 = time.perf_counter()
        records = run(req).records
        return time.perf_counter() - t0, records

    base, rec_base = timed("no-hang", ["fault_after"])
    hung, rec_hung = timed("with-hang", ["fault_hang", "fault_after"])
    hang = next(r for r in rec_hung if r.scenario == "fault_hang")
    print(f"(f) launch without a hung cell  : {base:7.1f} s  ({_summary(rec_base)})")
    print(f"    the same with a hung cell   : {hung:7.1f} s  ({_summary(rec_hung)}); the hung cell: "
          f"{hang.status} after {hang.duration_s:.1f} s (timeout {hang.timeout_s:.0f} s)")
    print(f"    extra wall for the hang     : {hung - base:7.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="ab,cd,e,f", help="comma-separated: ab, cd, e, f")
    parser.add_argument("--repeat", type=int, default=3, help="(a)/(b): each baseline scenario this many times")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"ab", "cd", "e", "f"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "ab" in parts:
            part_ab(folder, args.repeat)
        if parts & {"cd", "e"}:
            part_cde(folder, older_plan="cd" in parts, with_hf="e" in parts)
        if "f" in parts:
            part_f(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
