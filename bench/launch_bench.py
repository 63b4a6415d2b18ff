"""Launch benchmark, measured side by side in one run on the installed torch. Prints every figure.

(a) vs (b): the same small cells, one torchrun per cell vs all in one torchrun.
(c) vs (d): the whole CPU suite without the Hugging Face pack (every variant, world sizes
            1, 2, 4), one launch per world size (the older plan) vs one launch per device
            (the default: smaller world sizes on slots of its ranks, abort-prone cells in
            forked processes).
(e):        the whole CPU suite with the Hugging Face pack (``python -m harness run``, every
            scenario and variant, world sizes 1, 2, 4); ratio (e)/(d) where (d) ran; beside it
            (g) a bare 4-rank gloo start (torchrun, init_process_group, barrier, destroy), before
            and after each round, and the ratio (e)/(g); then the breakdown: every rank
            process's wall and CPU seconds per phase (``harness.rank.phases``), summed over the
            ranks and launches, and the CPU outside the ranks (launcher, torchrun agents).
            ``--against DIR`` runs the same suite from another checkout in the same rounds,
            alternating, as a column of its own (before/after a change: how a saving is
            measured, commit against commit, with no switch left in the code), each with its
            difference from (e); ``--column 'LABEL:NAME=VALUE'`` a column with an environment variable set
            (``FSDP_COMPAT_LEDGER=0``: the ledger's cost), ``--column 'LABEL:--option value'``
            one with ``harness run`` options added (``--isolate fork``: what a process per cell costs).
(f):        what a hung cell costs: a launch with a cell that hangs vs the same launch without it.

    python bench/launch_bench.py [--parts ab,cd,e,f] [--repeat 3] [--rounds 1] [--against DIR] [--column ...]
    nox -s bench -- --parts e --rounds 3 --against ../fsdp-compat-old
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.launch.launcher import LaunchOptions, run_cells  # noqa: E402
from harness.launch.pipeline import run  # noqa: E402
from harness.plan.cells import plan_cells  # noqa: E402
from harness.rank.phases import format_table, load_totals, record_sum  # noqa: E402
from harness.results.record import Record  # noqa: E402
from harness.runconfig import RunConfig  # noqa: E402
from harness.scenario.load import load_scenarios  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001 (figures show as they are measured)

BASELINE = ["plain", "cpu_offload", "mixed_precision", "hsdp"]
FAULTS = ROOT / "tests" / "fixtures" / "scenarios"
BARE = ROOT / "bench" / "bare_start.py"


def _timed_suite(folder: Path, name: str, scenarios: list[str], per: str) -> tuple[float, list[Record]]:
    req = RunConfig(scenarios=scenarios, run_id=name, out=folder / f"{name}.jsonl", per=per)
    t0 = time.perf_counter()
    result = run(req)
    return time.perf_counter() - t0, result.records


def _summary(records: list[Record]) -> str:
    bad = sum(1 for r in records if not r.as_expected)
    skipped = sum(1 for r in records if r.status == "skip")
    return f"{len(records)} cells, {bad} not as expected, {skipped} skipped"


def part_ab(folder: Path, repeat: int) -> None:
    scenarios = load_scenarios().scenarios
    cells = plan_cells([scenarios[n] for n in BASELINE] * repeat, world_sizes=[2], devices=["cpu"],
                       variants=["vanilla"], explicit_scenarios=True)
    for i, c in enumerate(cells):
        c.index = i

    def timed(name: str, batches: list[list]) -> tuple[float, list[Record]]:
        opts = LaunchOptions(config=RunConfig(run_id=name, out=folder / f"{name}.jsonl"))
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


def part_cd(folder: Path) -> float:
    """(c) the older plan and (d) the default plan on the same cells; returns (d)'s wall."""
    core, _ = _cpu_scenarios()
    old, rec_c = _timed_suite(folder, "per-world-size", core, "world-size")
    print(f"(c) suite, launch per world size: {old:7.1f} s  ({_summary(rec_c)})")
    new, rec_d = _timed_suite(folder, "per-device", core, "device")
    print(f"(d) suite, launch per device    : {new:7.1f} s  ({_summary(rec_d)})")
    print(f"    ratio (c)/(d)               : {old / new:7.2f}x")
    return new


@dataclass(kw_only=True)
class SuiteRun:
    """One ``python -m harness run`` of the suite: its wall, the CPU of everything it started,
    its records and its processes' phases (``harness.rank.phases``)."""

    wall: float
    cpu: float
    records: list[Record] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    processes: int = 0


def bare_start(world: int = 4) -> float:
    """Wall seconds of torchrun starting ``world`` ranks that join a gloo group, meet and leave."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), str(BARE)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    return time.perf_counter() - t0


def cli_suite(tree: Path, out: Path, scenarios: list[str], extra_env: dict[str, str] | None = None,
              extra_args: list[str] | None = None) -> SuiteRun:
    """The suite as users run it, from checkout ``tree`` (its own harness and scenarios), with
    ``extra_env`` set (``FSDP_COMPAT_LEDGER=0``: the ledger off) and
    ``extra_args`` added to ``harness run``."""
    cmd = [sys.executable, "-m", "harness", "run", "--quiet", "--device", "cpu", "--out", str(out), *(extra_args or [])]
    cmd += [a for n in scenarios for a in ("--scenario", n)]
    cmd += [] if scenarios else ["--world-size", "1", "--world-size", "2", "--world-size", "4"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra_env or {})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if not out.is_file():  # refused before any cell ran (a bad scenario name, a device it lacks)
        last = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
        raise SystemExit(f"the suite from {tree} wrote no records: {last}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    records = [Record.from_json(line) for line in out.read_text().splitlines() if line.strip()]
    phases, processes = load_totals([out.parent / f"{out.stem}.logs"])
    return SuiteRun(wall=wall, cpu=cpu, records=records, phases=phases, processes=processes)


def part_eg(folder: Path, *, trees: dict[str, tuple[Path, dict[str, str], list[str]]], rounds: int, scenarios: list[str],
            default_wall: float | None) -> None:
    """(e) per column (a checkout, an environment variable, ``harness run`` options) and (g) the bare start, alternating for
    ``rounds``; then the breakdown."""
    runs: dict[str, list[SuiteRun]] = {name: [] for name in trees}
    bare = [bare_start()]
    for r in range(rounds):
        order = list(enumerate(trees.items()))
        for i, (name, (tree, env, extra)) in order if r % 2 == 0 else reversed(order):
            runs[name].append(cli_suite(tree, folder / f"suite-{i}-round{r}.jsonl", scenarios, env, extra))
        bare.append(bare_start())
    g = statistics.median(bare)
    what = "suite with the HF pack" if not scenarios else f"suite of {', '.join(scenarios)}"[:29]
    for i, (name, done) in enumerate(runs.items()):
        label = "(e)" if i == 0 else f"(e{i})"
        wall = statistics.median(r.wall for r in done)
        print(f"{label:<4}{what:<28}: {wall:7.1f} s  ({_summary(done[-1].records)})"
              + (f"  [{name}]" if len(trees) > 1 else "") + (f"  median of {rounds}" if rounds > 1 else ""))
        if i == 0 and default_wall:
            print(f"    ratio (e)/(d)               : {wall / default_wall:7.2f}x")
    print(f"(g) bare 4-rank gloo start      : {g:7.1f} s  (torchrun, init_process_group, barrier, destroy; "
          f"median of {len(bare)})")
    first = statistics.median(r.wall for r in next(iter(runs.values())))
    for i, (name, done) in enumerate(runs.items()):
        label = "(e)" if i == 0 else f"(e{i})"
        wall = statistics.median(r.wall for r in done)
        gain = "" if i == 0 else f"   {label} - (e): {wall - first:+6.1f} s  [{name}]"
        print(f"    ratio {label}/(g){'':<{18 - len(label)}}: {wall / g:7.2f}x{gain}")
    print()
    print(breakdown(runs))


def breakdown(runs: dict[str, list[SuiteRun]]) -> str:
    """Wall and CPU per phase, summed over every rank process of the run (mean over rounds),
    then the CPU outside the ranks and how far the cells' phases add up to their wall."""
    columns, lines = {}, []
    for name, done in runs.items():
        mean = {}
        for suite in done:
            for k, (wall, cpu) in suite.phases.items():
                entry = mean.setdefault(k, [0.0, 0.0])
                entry[0] += wall / len(done)
                entry[1] += cpu / len(done)
        columns[name] = mean
        ranks_cpu = sum(cpu for _, cpu in mean.values())
        cpu = statistics.mean(r.cpu for r in done)
        cells = [rec for rec in done[-1].records if rec.phases is not None]
        phased, wall = sum(record_sum(rec.phases) for rec in cells), sum(rec.duration_s or 0 for rec in cells)
        lines.append(f"[{name}] {done[-1].processes} processes; CPU of everything started {cpu:.1f} s, of which "
                     f"outside the ranks (launcher, torchrun agents) {cpu - ranks_cpu:.1f} s")
        lines.append(f"[{name}] cells with phases: {len(cells)}; their phases add up to {phased:.2f} s of their "
                     f"{wall:.2f} s wall")
        lines.append(harness_share(name, mean))
    head = "breakdown: wall and CPU seconds per phase, summed over every rank process (harness.rank.phases)"
    return "\n".join([head, format_table(columns), *lines])


#: the cells' own FSDP2 work and the single-process reference; every other phase is the harness's
CELL_WORK = ("build + shard", "training", "reference")


def harness_share(name: str, mean: dict[str, list[float]]) -> str:
    """The harness's own share of rank CPU: everything but ``CELL_WORK``; and with the snapshots'
    gathering counted as the cells' work too (it is what the comparison needs of them)."""
    total = sum(cpu for _, cpu in mean.values())
    work = sum(mean.get(k, [0.0, 0.0])[1] for k in CELL_WORK)
    gather = mean.get("gather", [0.0, 0.0])[1]
    if total <= 0:
        return f"[{name}] the harness's own share of rank CPU: no phases recorded"
    own, lenient = total - work, total - work - gather
    # seconds to 0.01: rounded to 0.1, a small suite's (5 s of CPU) figures no longer give back its percentage
    return (f"[{name}] the harness's own share of rank CPU: {own / total:.0%} ({own:.2f} of {total:.2f} s: all but "
            f"{', '.join(CELL_WORK)}); {lenient / total:.0%} ({lenient:.2f} s) with gathering counted as cell work")


def part_f(folder: Path) -> None:
    def timed(name: str, scenarios: list[str]) -> tuple[float, list[Record]]:
        req = RunConfig(scenarios=scenarios, run_id=name, out=folder / f"{name}.jsonl", variants=["vanilla"],
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
    parser.add_argument("--rounds", type=int, default=1, help="(e)/(g): alternating rounds (medians printed)")
    parser.add_argument("--against", action="append", default=[], metavar="DIR",
                        help="(e): also run the suite from this checkout, alternating (repeatable)")
    parser.add_argument("--scenario", action="append", default=[], help="(e): only these scenarios (repeatable)")
    parser.add_argument("--column", action="append", default=[], metavar="LABEL:NAME=VALUE",
                        help="(e): also the suite with this environment variable set, as a column (repeatable; "
                             "e.g. 'without ledger:FSDP_COMPAT_LEDGER=0')")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"ab", "cd", "e", "f"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    trees: dict[str, tuple[Path, dict[str, str], list[str]]] = {"this checkout": (ROOT, {}, [])}
    for column in args.column:
        label, _, assignment = column.partition(":")
        if assignment.startswith("--"):  # harness run options
            trees[label] = (ROOT, {}, assignment.split())
            continue
        name, eq, value = assignment.partition("=")
        if not (label and name and eq):
            parser.error(f"--column {column!r}: expected LABEL:NAME=VALUE or LABEL:--option [value]")
        trees[label] = (ROOT, {name: value}, [])
    for other in args.against:
        if not (Path(other) / "harness" / "__main__.py").is_file():
            parser.error(f"--against {other}: not a checkout of this project (no harness/__main__.py)")
        trees[str(other)] = (Path(other).resolve(), {}, [])
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if "e" in parts and not args.scenario and importlib.util.find_spec("transformers") is None:
        parser.error("(e) is the suite with the HF pack, and transformers is not importable here "
                     "(pip install -e '.[hf]'), so its hf_ cells would only be skipped; or pass --scenario")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "ab" in parts:
            part_ab(folder, args.repeat)
        default_wall = part_cd(folder) if "cd" in parts else None
        if "e" in parts:
            part_eg(folder, trees=trees, rounds=args.rounds, scenarios=args.scenario, default_wall=default_wall)
        if "f" in parts:
            part_f(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
