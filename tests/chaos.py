"""Fault-injection soak of the launcher: many runs, each with faults drawn at random.

Faults: a hang at the patches module's import or in a patch's install, a patch whose
install starts a child process, a hang in forward on one rank or on all, a SIGKILL of one
rank, an exception on one rank, an exception whose type and text are hostile (markup, a
formula, table pipes), a cell that leaks global state (the default dtype), and SIGINT or
SIGTERM to the harness itself. After every run it checks that every planned cell is
accounted for (recorded, or reported not run after a signal), that the records file
parses, that no process of the run is left (none whose command line or open files name
its folder, and none of the children the patch started), that each fault cost at most its
timeout + 5 s, and, when a hostile text was recorded, that the report built from the
records shows it inert (no ``<script`` in the HTML or Markdown, no CSV cell that starts a
formula). It prints the counts; the exit code is 1 when any check failed.

    python tests/chaos.py [--faults 100] [--seed 0] [--timeout 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "chaos"
SCENARIOS = [f"chaos_{i}" for i in range(6)]
CELL_FAULTS = ("hang one rank", "hang all ranks", "kill a rank", "raise on one rank", "raise hostile text",
               "leak global state")
SET_FAULTS = ("hang at import", "hang at install")
CHILD_FAULT = "child process at install"
SIGNALS = ("SIGINT", "SIGTERM")
#: the status a faulted cell must get (None: any; a leaked default dtype may change it or not)
EXPECTED_STATUS = {"hang one rank": "hang", "hang all ranks": "hang", "kill a rank": "crash",
                   "raise on one rank": "error", "raise hostile text": "error", "leak global state": None,
                   "hang at import": "hang", "hang at install": "hang"}
#: faults that need only one rank (so they can be drawn for world size 1)
ONE_RANK_OK = ("hang all ranks", "raise on one rank", "kill a rank", "raise hostile text", "leak global state")
CHILD_KIND = {"kill a rank": "kill", "raise on one rank": "raise", "raise hostile text": "hostile",
              "leak global state": "leak"}
#: a piece of the hostile exception type (``chaos_scenarios.HOSTILE_TYPE``): a CSV cell holding it is a formula
HOSTILE_MARK = "calc'!A0"
CSV_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


@dataclass
class Round:
    scenarios: list[str]
    world_sizes: list[int]
    faults: list[tuple[str, str | None]] = field(default_factory=list)  # (kind, cell key)
    signal: str | None = None
    signal_after_s: float = 0.0
    #: the chaos patch's install starts a child process (``sleep``) that would outlive the run
    child: bool = False


def draw(rng: random.Random) -> Round:
    r = Round(scenarios=rng.sample(SCENARIOS, 2), world_sizes=sorted(rng.sample([1, 2, 2, 4], 2)))
    r.world_sizes = sorted(set(r.world_sizes))
    for _ in range(rng.choice([1, 2])):
        kind = rng.choice(CELL_FAULTS + CELL_FAULTS + SET_FAULTS)
        if kind in SET_FAULTS:
            if not any(k in SET_FAULTS for k, _ in r.faults):
                r.faults.append((kind, None))
            continue
        ws = rng.choice([w for w in r.world_sizes if w > 1 or kind in ONE_RANK_OK])
        key = f"{rng.choice(r.scenarios)}/w{ws}/{rng.choice(['vanilla', 'patched'])}"
        if key not in {k for _, k in r.faults}:
            r.faults.append((kind, key))
    if rng.random() < 0.3:
        r.signal, r.signal_after_s = rng.choice(SIGNALS), rng.uniform(3.0, 14.0)
    r.child = rng.random() < 0.3
    return r


def _env(r: Round, rng: random.Random, folder: Path) -> dict[str, str]:
    cells = {}
    for kind, key in r.faults:
        if key is None:
            continue
        ws = int(key.split("/")[1][1:])
        rank = None if kind in ("hang all ranks", "leak global state") else rng.randrange(ws)
        cells[key] = {"kind": CHILD_KIND.get(kind, "hang"), "rank": rank}
    env = {**os.environ, "FSDP_COMPAT_CHAOS": json.dumps(cells), "PYTHONPATH": str(ROOT)}
    env.pop("FSDP_COMPAT_CHAOS_CHILD", None)
    for kind, _ in r.faults:
        if kind in SET_FAULTS:
            env["FSDP_COMPAT_CHAOS_PATCHES"] = kind.split()[-1]
    if r.child:
        (folder / "children").mkdir()
        env["FSDP_COMPAT_CHAOS_CHILD"] = str(folder / "children")
    return env


def run_round(r: Round, rng: random.Random, folder: Path, timeout_s: float) -> dict:
    out = folder / "records.jsonl"
    cmd = [sys.executable, "-m", "harness", "run", "--scenarios-dir", str(FIXTURES),
           "--patches", str(FIXTURES.parent / "chaos_patches.py"), "--timeout", str(timeout_s), "--out", str(out)]
    for s in r.scenarios:
        cmd += ["--scenario", s]
    for ws in r.world_sizes:
        cmd += ["--world-size", str(ws)]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(r, rng, folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=_default_signals)
    sent_at = None
    if r.signal:
        try:
            proc.wait(timeout=r.signal_after_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(getattr(signal, r.signal))
            sent_at = time.time()
    output, _ = proc.communicate(timeout=1200)
    ended = time.time()
    return _check(r, proc.returncode, output, out, folder, timeout_s, sent_at, ended - t0, ended)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job starts with SIGINT ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check(r: Round, code: int, output: str, out: Path, folder: Path, timeout_s: float, sent_at: float | None,
           wall: float, ended: float) -> dict:
    from harness.results.record import Record

    problems = []
    planned = int(m.group(1)) if (m := re.search(r"^(\d+) cells -> ", output, re.M)) else None
    lines = out.read_text().splitlines() if out.exists() else []
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(Record.from_json(line))
        except ValueError as e:
            problems.append(f"records line {n} does not parse: {e}")
    interrupted = re.search(r"interrupted by (\w+): (\d+) cells recorded, (\d+) not run", output)
    not_run = int(interrupted.group(3)) if interrupted else 0
    if sent_at is not None and interrupted:
        if code != 128 + getattr(signal, r.signal):
            problems.append(f"{r.signal}: exit code {code}")
        if ended - sent_at > 5:
            problems.append(f"{r.signal}: the harness took {ended - sent_at:.1f} s to stop")
        time.sleep(1.0)
        if len(out.read_text().splitlines()) != len(lines):
            problems.append("records were appended after the harness exited")
    elif code not in (0, 1):
        problems.append(f"exit code {code}: {output.strip().splitlines()[-1:]}")
    if planned is not None and len(records) + not_run != planned:
        problems.append(f"{planned} cells planned, {len(records)} recorded + {not_run} not run")
    left = leftovers(folder)
    if left:
        problems.append(f"processes left: {left}")
    set_hangs = any(k in SET_FAULTS for k, _ in r.faults)
    if r.child and not set_hangs and any(x.variant != "vanilla" and x.status != "skip" for x in records) \
            and not _children(folder):
        problems.append("the patch's child process was never started")
    if any(HOSTILE_MARK in (x.exc_type or "") for x in records):
        problems += _hostile_report_problems(out, folder)
    leaked = any(k == "leak global state" for k, _ in r.faults)
    faulted = {}
    for kind, key in r.faults:
        scen, ws, side = key.split("/") if key else (None, None, "patched")
        mine = [x for x in records if (key is None and x.variant != "vanilla") or
                (key is not None and x.scenario == scen and f"w{x.world_size}" == ws
                 and (x.variant == "vanilla") == (side == "vanilla"))]
        for x in mine:
            if x.duration_s is not None and x.duration_s > timeout_s + 5:
                problems.append(f"{kind}: {x.scenario}[{x.variant},w{x.world_size}] cost {x.duration_s:.1f} s")
            # a patch set that hangs at import or install hangs before any fault of its cells
            expected = "hang" if set_hangs and x.variant != "vanilla" else EXPECTED_STATUS[kind]
            # a leaked default dtype may change what a later cell does: only its accounting is checked
            if expected is not None and x.status != expected and not leaked:
                problems.append(f"{kind}: {x.scenario}[{x.variant},w{x.world_size}] is {x.status}")
        faulted[kind] = len(mine)
    return {"faults": [k for k, _ in r.faults] + ([r.signal] if sent_at else []) + ([CHILD_FAULT] if r.child else []),
            "planned": planned,
            "recorded": len(records), "not run": not_run, "left": len(left), "wall": round(wall, 1),
            "problems": problems, "faulted cells": faulted}


def _children(folder: Path) -> list[int]:
    """The pids of the child processes the chaos patch started (``chaos_patches.py``)."""
    noted = folder / "children"
    return [int(f.read_text()) for f in noted.glob("*.pid") if f.read_text().strip()] if noted.is_dir() else []


def _hostile_report_problems(out: Path, folder: Path) -> list[str]:
    """The report built from the records shows the hostile exception inert."""
    import csv

    from harness.results.report import build_report

    written = build_report([out], folder / "report")
    problems = []
    for kind in ("html", "md"):  # (the Markdown may show another variant's error for the cell)
        text = written[kind].read_text().lower()
        if "<script" in text:
            problems.append(f"the {kind} report has a <script")
        if kind == "html" and "&lt;script" not in text:
            problems.append(f"the {kind} report lost the hostile text")
    with open(written["csv"], newline="") as f:
        cells = [c for row in csv.reader(f) for c in row if HOSTILE_MARK in c]
    if not cells:
        problems.append("the CSV report lost the hostile exception type")
    problems += [f"a CSV cell starts a formula: {c[:40]!r}" for c in cells if c.startswith(CSV_TRIGGERS)]
    return problems


def leftovers(folder: Path) -> list[str]:
    """Processes of the run still alive: their command line or open files name its folder,
    or the chaos patch noted them as its children."""
    needle = str(folder)
    found = []
    for pid in _children(folder):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and p.name() == "sleep":
                found.append(f"{pid} {' '.join(p.cmdline())[:80]} (started by the patch)")
        except psutil.Error:
            continue
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if needle in " ".join(p.info["cmdline"] or []) or any(needle in f.path for f in p.open_files()):
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:80]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def soak(faults: int, seed: int, timeout_s: float, say=print) -> dict:
    rng = random.Random(seed)
    kinds: Counter[str] = Counter()
    totals = Counter()
    problems = []
    n = 0
    while sum(kinds.values()) < faults:
        r = draw(rng)
        with tempfile.TemporaryDirectory(prefix="fsdp-compat-chaos-") as tmp:
            res = run_round(r, rng, Path(tmp), timeout_s)
        n += 1
        kinds.update(res["faults"])
        totals.update({"planned": res["planned"] or 0, "recorded": res["recorded"], "not run": res["not run"],
                       "left": res["left"]})
        problems += [f"round {n}: {p}" for p in res["problems"]]
        say(f"round {n:>3}: {', '.join(res['faults']) or '-':<60} {res['recorded']:>3}/{res['planned']} recorded, "
            f"{res['not run']} not run, {res['left']} left, {res['wall']:5.1f} s{'  PROBLEM' if res['problems'] else ''}")
    return {"rounds": n, "kinds": dict(kinds), "totals": dict(totals), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=4.0)
    args = parser.parse_args(argv)
    t0 = time.time()
    res = soak(args.faults, args.seed, args.timeout)
    print(f"\n{res['rounds']} runs, {sum(res['kinds'].values())} faults in {time.time() - t0:.0f} s")
    print("| fault | count |\n|---|---|")
    for kind, count in sorted(res["kinds"].items()):
        print(f"| {kind} | {count} |")
    t = res["totals"]
    print(f"\ncells planned {t.get('planned', 0)}, recorded {t.get('recorded', 0)}, not run after a signal "
          f"{t.get('not run', 0)}; processes left {t.get('left', 0)}")
    for p in res["problems"]:
        print(f"PROBLEM {p}")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
