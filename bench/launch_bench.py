"""Launch amortization benchmark, measured side by side in one run.

(a) one torchrun per cell, (b) many cells per torchrun (the harness's way), over the same
cells; then the wall of the whole CPU suite (every scenario, both variants, world sizes
1, 2, 4). Prints every figure it measures.

    python bench/launch_bench.py [--world-size 2] [--skip-suite]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.launch import LaunchOptions, run_cells  # noqa: E402
from harness.plan import all_patch_names, plan_cells  # noqa: E402
from harness.registry import load_scenarios  # noqa: E402

BASELINE = ["plain", "cpu_offload", "mixed_precision", "hsdp"]


def _run(cells, folder: Path, name: str, *, one_per_launch: bool) -> tuple[float, list[dict]]:
    opts = LaunchOptions(run_id=name, out_path=folder / f"{name}.jsonl", log_dir=folder / f"{name}.logs")
    t0 = time.perf_counter()
    if one_per_launch:
        records = []
        for cell in cells:
            records += run_cells([cell], opts).records
    else:
        records = run_cells(cells, opts).records
    return time.perf_counter() - t0, records


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="each baseline scenario this many times")
    parser.add_argument("--skip-suite", action="store_true")
    args = parser.parse_args()
    scenarios = load_scenarios().scenarios
    chosen = [scenarios[n] for n in BASELINE] * args.repeat
    cells = plan_cells(chosen, world_sizes=[args.world_size], devices=["cpu"], variants=["vanilla"], explicit_scenarios=True)
    for i, c in enumerate(cells):
        c.index = i
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        per_cell, rec_a = _run(cells, folder, "per-cell", one_per_launch=True)
        amortized, rec_b = _run(cells, folder, "amortized", one_per_launch=False)
        print(f"cells: {len(cells)} (world size {args.world_size})")
        print(f"(a) one torchrun per cell : {per_cell:7.1f} s  ({per_cell / len(cells):.2f} s/cell)")
        print(f"(b) many cells per launch : {amortized:7.1f} s  ({amortized / len(cells):.2f} s/cell)")
        print(f"ratio (a)/(b)             : {per_cell / amortized:7.1f}x")
        bad = [r for r in rec_a + rec_b if r.status != "pass"]
        if bad:
            print(f"warning: {len(bad)} benchmark cells did not pass")
        if not args.skip_suite:
            suite = plan_cells(list(scenarios.values()), world_sizes=[1, 2, 4], devices=["cpu"],
                               variants=["vanilla", "patched"], explicit_scenarios=False,
                               baseline_patches=all_patch_names(list(scenarios.values())))
            wall, recs = _run(suite, folder, "suite", one_per_launch=False)
            unexpected = sum(1 for r in recs if not r.as_expected)
            print(f"CPU suite: {len(suite)} cells in {wall:.1f} s ({unexpected} not as expected)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
