"""A rerun of the whole matrix with nothing changed, measured: ``nox -s matrix`` run again on
records that answer every cell (so only the always-run hangs and crashes run), rounds
alternating between this checkout and another commit, each on its own saved records.

For each run: the wall, each session's wall as nox prints it, how many sessions adopted a
run planned ahead (``harness/envs/ahead.py``), the cells reused and the always-run hang
cells' durations (their spread is most of a rerun's). Then each side's median.

    python bench/matrix_rerun.py --records DIR [--against REV --against-records DIR] [--rounds N]

``DIR``: a copy of ``runs/`` that a complete ``nox -s matrix`` of that side wrote (a cell's key
includes the harness's code and where it lies, so each side needs its own, made in this
folder); each run starts from a hard-linked copy of it, so the copy stays as it was. With
``--against`` the working tree must be clean: the other commit is checked out for its runs
and this one back after each (its bytecode recompiles once per switch, on both sides alike).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def one_run(records: Path) -> dict:
    """``nox -s matrix`` on a fresh hard-linked copy of ``records`` as ``runs/``."""
    runs = ROOT / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    subprocess.run(["cp", "-al", str(records), str(runs)], check=True)
    t0 = time.perf_counter()
    res = subprocess.run(["nox", "-s", "matrix"], cwd=ROOT, capture_output=True, text=True)
    return {"wall": time.perf_counter() - t0, "code": res.returncode, **summary(res.stdout + res.stderr)}


def summary(log: str) -> dict:
    """What a ``nox -s matrix`` log says of its sessions, adoptions, reuse and hang cells."""
    return {"sessions": re.findall(r"matrix\(torch='([\d.]+)', device='cpu'\) was successful in (\S+ \w+)", log),
            "adopted": log.count("(planned while the session before ran its cells)"),
            "reused": sum(int(n) for n in re.findall(r"\((\d+) reused: inputs unchanged", log)),
            "hangs": [float(s) for s in re.findall(r"\]\s+\S+\s+hang\s+(\d+\.\d+)s", log)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, required=True, help="a copy of runs/ a complete run of this checkout wrote")
    p.add_argument("--against", help="another commit, run alternately")
    p.add_argument("--against-records", type=Path, help="a copy of runs/ a complete run of that commit wrote")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if args.against and not args.against_records:
        p.error("--against needs --against-records")
    if args.against and _git("status", "--porcelain", "--untracked-files=no"):
        p.error("--against checks another commit out: commit or stash first")
    here = _git("rev-parse", "--abbrev-ref", "HEAD")
    here = here if here != "HEAD" else _git("rev-parse", "HEAD")
    sides = [(_git("rev-parse", "--short", "HEAD"), None, args.records)]
    if args.against:
        sides.insert(0, (_git("rev-parse", "--short", args.against), args.against, args.against_records))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in sides}
    try:
        for rnd in range(1, args.rounds + 1):
            for name, rev, records in sides:
                _git("checkout", "-q", rev or here)
                run = one_run(records)
                results[name].append(run)
                print(f"round {rnd} {name}: {run['wall']:.1f} s (exit {run['code']}), {run['adopted']} adopted, "
                      f"{run['reused']} reused; sessions {', '.join(f'{v} {w}' for v, w in run['sessions'])}; "
                      f"hangs {' '.join(f'{h:.2f}' for h in run['hangs'])} s", flush=True)
    finally:
        _git("checkout", "-q", here)
    for name, runs in results.items():
        walls, hangs = [r["wall"] for r in runs], [h for r in runs for h in r["hangs"]]
        print(f"[{name}] no-change matrix: median {statistics.median(walls):.1f} s of {len(walls)} "
              f"({', '.join(f'{w:.1f}' for w in walls)}); hang cells median {statistics.median(hangs or [0]):.2f} s, "
              f"max {max(hangs or [0]):.2f} s")
    return 1 if any(r["code"] for runs in results.values() for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
