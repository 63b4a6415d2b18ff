"""Incremental reruns, measured: the default CPU matrix of one torch version run fresh, then
again after each of a set of edits, in a scratch copy of the project; for each: the cells
that ran, the wall, its share of the fresh wall, and whether the verdicts equal the fresh
run's (``harness diff --strict``). Exit 1 on a verdict change or on a cell that ran (or was
reused) against what its edit predicts.

    python bench/incremental.py [--python PATH] [--world-size N ...] [--scenario NAME ...]

``nox -s incremental`` runs it with the matrix venv of the test torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY = ("harness", "scenarios", "fsdp_patches", "stacks", "matrix.yaml", "pyproject.toml")


def _append(path: Path, text: str = "\n# edited\n") -> None:
    with open(path, "a") as f:
        f.write(text)


#: edit name -> (what it changes in the copy, which cells must run: (scenario, variant, installed patches) -> bool)
EDITS: dict[str, tuple[Callable[[Path], None], Callable[[dict], bool]]] = {
    "no change": (lambda root: None, lambda rec: False),
    "a patch function's file (fsdp_patches/nonfloat.py)": (
        lambda root: _append(root / "fsdp_patches" / "nonfloat.py"),
        lambda rec: "nonfloat_params" in rec["installed_patches"]),
    "a scenario file (scenarios/plain.py)": (
        lambda root: _append(root / "scenarios" / "plain.py"),
        lambda rec: rec["scenario"] == "plain"),
    "a helper scenarios import (scenarios/_unfreeze.py)": (
        lambda root: _append(root / "scenarios" / "_unfreeze.py"),
        lambda rec: rec["scenario"].startswith("i")),
}


def _run(python: str, root: Path, out: Path, args: list[str]) -> tuple[float, list[dict]]:
    t0 = time.time()
    res = subprocess.run([python, "-m", "harness", "run", "--quiet", "--out", str(out), *args], cwd=root,
                         capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode not in (0, 1):
        sys.exit(f"harness run failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    latest = lines[-1]["run_id"]
    return wall, [r for r in lines if r["run_id"] == latest]


def _cell(rec: dict) -> tuple:
    return rec["scenario"], rec["variant"], rec["world_size"], rec.get("fault")


def _always(rec: dict, previous: dict[tuple, dict]) -> bool:
    """Runs whatever changed: documented to hang or crash, or its last record was not as
    expected or a hang or crash (``harness.launch.incremental``)."""
    last = previous.get(_cell(rec))
    expected = rec["expected"].split("|") if isinstance(rec["expected"], str) else rec["expected"]
    return bool({"hang", "crash"} & set(expected)) or last is None or not last["as_expected"] or \
        last["status"] in ("hang", "crash")


def _diff(python: str, root: Path, old: Path, new: Path) -> bool:
    res = subprocess.run([python, "-m", "harness", "diff", "--strict", str(old), str(new)], cwd=root,
                         capture_output=True, text=True)
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--world-size", action="append", default=[])
    parser.add_argument("--scenario", action="append", default=[])
    opts = parser.parse_args(argv)
    args = [*(x for w in opts.world_size for x in ("--world-size", w)),
            *(x for s in opts.scenario for x in ("--scenario", s))]
    with tempfile.TemporaryDirectory(prefix="incremental-") as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        for name in COPY:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy(src, root / name)
        out = Path(tmp) / "records.jsonl"
        fresh_wall, fresh = _run(opts.python, root, out, [*args, "--fresh"])
        fresh_file = Path(tmp) / "fresh.jsonl"
        fresh_file.write_text("".join(json.dumps(r) + "\n" for r in fresh))
        print(f"fresh: {len(fresh)} cells, {fresh_wall:.1f} s")
        print("\n| edit | cells run | wall (s) | of fresh | verdicts vs fresh | ran as predicted |\n|---|---|---|---|---|---|")
        print(f"| (fresh, --fresh) | {len(fresh)} | {fresh_wall:.1f} | 100% | - | - |")
        bad = False
        previous = {_cell(r): r for r in fresh}
        for name, (edit, predicts) in EDITS.items():
            edit(root)
            wall, recs = _run(opts.python, root, out, args)
            ran = [r for r in recs if not r.get("reused_from")]
            wrong = [r for r in recs if (not r.get("reused_from")) != (predicts(r) or _always(r, previous))]
            previous = {_cell(r): r for r in recs}
            step = Path(tmp) / "step.jsonl"
            step.write_text("".join(json.dumps(r) + "\n" for r in recs))
            same = _diff(opts.python, root, fresh_file, step)
            bad |= bool(wrong) or not same
            print(f"| {name} | {len(ran)} | {wall:.1f} | {wall / fresh_wall:.0%} | "
                  f"{'same' if same else 'CHANGED'} | {'yes' if not wrong else f'no: {len(wrong)} cells'} |", flush=True)
            for r in wrong:
                what = "ran" if not r.get("reused_from") else "was reused"
                print(f"  {r['scenario']}[{r['variant']},w{r['world_size']}] {what} ({r['status']}, installed "
                      f"{','.join(r['installed_patches']) or 'nothing'})", file=sys.stderr, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
