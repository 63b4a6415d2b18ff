"""Incremental reruns, measured: the default CPU matrix of one torch version run fresh, then
again after each of a set of edits, in a scratch copy of the project; for each: the cells
that ran, the wall, its share of the fresh wall, and whether the verdicts equal the fresh
run's (``harness diff --strict``). A patch function's edit must rerun exactly the cells whose
last record says they ran it (``code_deps``); the last edit breaks a patch function, and the
incremental run must give the verdicts a fresh run of the broken module gives. Exit 1 on a
verdict change or on a cell that ran (or was reused) against what its edit predicts. Last,
from the fresh run's records, what an edit of each patch function it ran would cost at the
least (``every_function``): the edits above are three of them.

    python bench/incremental.py [--python PATH] [--slots N] [--world-size N ...] [--scenario NAME ...]

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


def insert_first(path: Path, qualname: str, line: str) -> None:
    """Put ``line`` first in the body of function ``qualname`` of ``path`` (after its docstring),
    indented as that body is."""
    import ast

    from harness.undertest.code_ran import functions

    source = path.read_text()
    node = dict(functions(ast.parse(source)))[qualname]
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    anchor = body[1] if has_doc and len(body) > 1 else body[0]
    lines = source.splitlines(keepends=True)
    at = body[0].end_lineno if has_doc and len(body) == 1 else anchor.lineno - 1
    lines.insert(at, " " * anchor.col_offset + line + "\n")
    path.write_text("".join(lines))


def _edit_function(file: str, qualname: str, line: str = "_edited = None") -> Callable[[Path], None]:
    return lambda root: insert_first(root / "fsdp_patches" / file, qualname, line)


def _ran_function(fid: str) -> Callable[[dict, dict | None], bool]:
    """Predicts: the cells whose last record says they ran ``fid``."""
    return lambda rec, last: fid in ((last or {}).get("code_deps") or {})


#: the patch function the last edit breaks; every cell that ran it must get the verdict a fresh run gets
BROKEN = ("grads.py", "clip_grad_norm_")

#: edit name -> (what it changes in the copy, which cells must run: (record, its previous record) -> bool)
EDITS: dict[str, tuple[Callable[[Path], None], Callable[[dict, dict | None], bool]]] = {
    "no change": (lambda root: None, lambda rec, last: False),
    "a comment in a patch file (fsdp_patches/nonfloat.py)": (
        lambda root: _append(root / "fsdp_patches" / "nonfloat.py"), lambda rec, last: False),
    "patch function nonfloat.py::_without_frozen_nonfloat (the torch 2.7 wrapper)": (
        _edit_function("nonfloat.py", "_without_frozen_nonfloat"), _ran_function("nonfloat.py::_without_frozen_nonfloat")),
    "patch function grads.py::clip_grad_norm_": (
        _edit_function("grads.py", "clip_grad_norm_"), _ran_function("grads.py::clip_grad_norm_")),
    "patch function unused_params.py::_restore_around (runs in every deployed cell)": (
        _edit_function("unused_params.py", "_restore_around"), _ran_function("unused_params.py::_restore_around")),
    "a scenario file (scenarios/plain.py)": (
        lambda root: _append(root / "scenarios" / "plain.py"),
        lambda rec, last: rec["scenario"] == "plain"),
    "a helper scenarios import (scenarios/_unfreeze.py)": (
        lambda root: _append(root / "scenarios" / "_unfreeze.py"),
        lambda rec, last: rec["scenario"].startswith("i")),
    "grads.py::clip_grad_norm_ broken (raises): against a fresh run of the broken module": (
        _edit_function(*BROKEN, "raise RuntimeError('clip_grad_norm_ broken by bench/incremental.py')"),
        _ran_function("::".join(BROKEN))),
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


def least_wall(floor: float, fresh_wall: float, cells: list[dict], fresh: list[dict]) -> tuple[float, float]:
    """What an edit that reruns ``cells`` holds of the fresh run's cell work (each cell's wall on
    its judge, summed over ``fresh``: neither counts the cells that always run), and the least
    wall it could take at the fresh run's pace: ``floor`` (the no-change run: the launch's start
    and the cells that always run) plus that share of the rest of the fresh run's wall."""
    total = sum(r.get("duration_s") or 0.0 for r in fresh)
    share = sum(r.get("duration_s") or 0.0 for r in cells) / total if total else 0.0
    return share, floor + share * max(0.0, fresh_wall - floor)


def by_function(records: list[dict]) -> dict[str, list[dict]]:
    """Each function of the module under test that ran in a cell of ``records`` (its record's
    ``code_deps``; a module's own top level left out: it runs at import) -> the records of the
    cells that ran it: the cells an edit of that function reruns."""
    ran: dict[str, list[dict]] = {}
    for r in records:
        for fid in r.get("code_deps") or {}:
            if "::" in fid and not fid.endswith("::<module>"):
                ran.setdefault(fid, []).append(r)
    return ran


def every_function(floor: float, fresh_wall: float, work: list[dict], target: float = 0.35) -> str:
    """What an edit of each patch function the fresh run ran would cost at the least: its
    cells' share of the fresh cell work and the least wall that gives (``least_wall``); how
    many are within ``target`` of the fresh wall, and the costliest."""
    rows = sorted(((least_wall(floor, fresh_wall, cells, work), fid, len(cells))
                   for fid, cells in by_function(work).items()), reverse=True)
    if not rows:
        return "no patch function ran in a cell of the fresh run"
    ratios = [least / fresh_wall for (_, least), _, _ in rows]
    within = sum(r <= target for r in ratios)
    lines = [f"\nan edit of each of the {len(rows)} patch functions the fresh run ran, at the fresh run's pace: "
             f"least wall within {target:.0%} of the fresh wall for {within}, median {sorted(ratios)[len(ratios) // 2]:.0%}",
             "| patch function | cells | share of the fresh cell work | least wall |", "|---|---|---|---|"]
    shown = rows[:8] + rows[-3:] if len(rows) > 11 else rows
    for (share, least), fid, n in shown:
        lines.append(f"| `{fid}` | {n} | {share:.0%} | {least:.1f} s ({least / fresh_wall:.0%}) |")
    return "\n".join(lines)


def _diff(python: str, root: Path, old: Path, new: Path) -> bool:
    res = subprocess.run([python, "-m", "harness", "diff", "--strict", str(old), str(new)], cwd=root,
                         capture_output=True, text=True)
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--world-size", action="append", default=[])
    parser.add_argument("--scenario", action="append", default=[])
    parser.add_argument("--slots", default="1", help="harness run --slots (nox -s incremental: the matrix's CPU slots)")
    opts = parser.parse_args(argv)
    args = ["--slots", opts.slots, *(x for w in opts.world_size for x in ("--world-size", w)),
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
        print("\n| edit | cells run | wall (s) | of fresh | of the fresh cell work: least wall at its pace | "
              "verdicts vs fresh | ran as predicted |\n|---|---|---|---|---|---|---|")
        print(f"| (fresh, --fresh) | {len(fresh)} | {fresh_wall:.1f} | 100% | 100% | - | - |")
        bad = False
        by_cell = previous = {_cell(r): r for r in fresh}  # ``previous`` is rebound at each edit, ``by_cell`` stays
        always = {c for c, r in by_cell.items() if _always(r, by_cell)}  # in every run: in the floor
        work = [r for c, r in by_cell.items() if c not in always]
        floor = None
        for name, (edit, predicts) in EDITS.items():
            edit(root)
            wall, recs = _run(opts.python, root, out, args)
            ran = [r for r in recs if not r.get("reused_from")]
            wrong = [r for r in recs if (not r.get("reused_from")) != (predicts(r, previous.get(_cell(r))) or
                                                                      _always(r, previous))]
            previous = {_cell(r): r for r in recs}
            step = Path(tmp) / "step.jsonl"
            step.write_text("".join(json.dumps(r) + "\n" for r in recs))
            if "broken" in name:  # the same edit, run fresh: the verdicts the incremental run must give
                _, broken = _run(opts.python, root, Path(tmp) / "broken-fresh.jsonl", [*args, "--fresh"])
                fresh_file.write_text("".join(json.dumps(r) + "\n" for r in broken))
                before = {_cell(r): r["status"] for r in fresh}
                print(f"  the break changed the status of {sum(before.get(_cell(r)) != r['status'] for r in broken)} "
                      f"cells in a fresh run", flush=True)
            same = _diff(opts.python, root, fresh_file, step)
            bad |= bool(wrong) or not same
            floor = wall if floor is None else floor  # the first edit changes nothing
            share, least = least_wall(floor, fresh_wall, [by_cell[_cell(r)] for r in ran if _cell(r) not in always], work)
            print(f"| {name} | {len(ran)} | {wall:.1f} | {wall / fresh_wall:.0%} | {share:.0%}: {least:.1f} s "
                  f"({least / fresh_wall:.0%}) | "
                  f"{'same' if same else 'CHANGED'} | {'yes' if not wrong else f'no: {len(wrong)} cells'} |", flush=True)
            for r in wrong:
                what = "ran" if not r.get("reused_from") else "was reused"
                print(f"  {r['scenario']}[{r['variant']},w{r['world_size']}] {what} ({r['status']}, installed "
                      f"{','.join(r['installed_patches']) or 'nothing'})", file=sys.stderr, flush=True)
        print(every_function(floor or 0.0, fresh_wall, work))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
