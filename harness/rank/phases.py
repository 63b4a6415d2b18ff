"""Where a rank's time goes: wall and CPU seconds per phase of its work, kept cheaply.

Every process of a launch (worker, forked cell process) has one ``CLOCK``. The code
switches it from phase to phase (``enter``, or ``timed`` around a block); each switch
charges the wall (``time.perf_counter``) and CPU (``time.process_time``: every thread of
the process) since the last one to the phase that was running, so the phases of a
process add up to its life. The watchdog's phase stamps switch it too (``category_of``
maps "step 0 micro-batch 1 backward" to "training").

The judge puts the phases of its cell on the record (``Record.phases``: from the cell's
start to its record); each process writes its totals beside the launch's other files
(``LaunchPlan.phase_times_file``) at the end of every stage and at exit, and ``load_totals``
adds them up for the benchmark's breakdown (``bench/launch_bench.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CATEGORIES", "CLOCK", "PhaseClock", "category_of", "fold", "format_table", "load_totals", "process_age",
           "read_totals", "record_sum"]

#: the phases in the order a cell meets them (the breakdown's rows), with what each covers
CATEGORIES: dict[str, str] = {
    "startup": "process start to the worker's first line: Python, import torch and the harness",
    "scenarios": "loading the scenario files",
    "preload": "modules a patch may touch, and the scenarios' requirements (transformers)",
    "rendezvous": "the zygote fork, the store connection",
    "patches": "importing, installing and undoing patch sets",
    "state": "taking and putting back process-wide state",
    "group setup": "init_process_group",
    "build + shard": "device mesh, model build, fully_shard",
    "reduction probe": "the gloo AVG probe",
    "training": "forward, backward, clipping, optimizer steps",
    "gather": "copying snapshots, gathering them to the judge, handing them to its referee",
    "group teardown": "destroying or keeping the cell's groups",
    "agree": "posting outcomes, waiting for peers and the record",
    "reference": "the single-process reference",
    "compare": "comparison, ledger, resource and sharding checks",
    "record": "writing the record",
    "watchdog": "arming and disarming (a phase stamp counts in the phase it opens)",
    "forked cell": "the worker waiting for a cell's forked process",
    "stage wait": "waiting for the other slots at the end of a stage",
    "other": "anything else",
}

_BY_PREFIX = (("install patches", "patches"), ("import patches", "patches"), ("init group", "group setup"),
              ("build model", "build + shard"), ("measure the reduction", "reduction probe"),
              ("reference", "reference"))


def category_of(phase: str) -> str:
    """The breakdown's phase of a watchdog stamp (``harness.protocol``'s phase names)."""
    for prefix, category in _BY_PREFIX:
        if phase.startswith(prefix):
            return category
    if phase.startswith("step "):
        return "gather" if " gather " in phase else "training"
    return "other"


class PhaseClock:
    """Wall and CPU seconds per phase of this process; one phase runs at a time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, current: str = "other") -> None:
        self.totals: dict[str, list[float]] = {}
        self.current = current
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def enter(self, phase: str) -> str:
        """Charge the time since the last switch to the running phase, start ``phase``;
        returns the phase that ran. Entering the phase that runs changes nothing and reads no
        clock (``process_time`` is a system call, about 3 µs: a suite's ranks switch 290,000 times)."""
        if phase == self.current:
            return phase
        self._charge()
        previous, self.current = self.current, phase
        return previous

    def _charge(self) -> None:
        """The time since the last switch, to the running phase."""
        wall, cpu = time.perf_counter(), time.process_time()
        entry = self.totals.get(self.current)
        if entry is None:
            entry = self.totals[self.current] = [0.0, 0.0]
        entry[0] += wall - self._wall
        entry[1] += cpu - self._cpu
        self._wall, self._cpu = wall, cpu

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """``phase`` for the block, then the phase that ran before it."""
        previous = self.enter(phase)
        try:
            yield
        finally:
            self.enter(previous)

    def skip(self) -> None:
        """Charge the time since the last switch to no phase (a wait that is no one's work)."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def add(self, phase: str, wall: float, cpu: float) -> None:
        """Time spent before the clock started (``startup``)."""
        entry = self.totals.setdefault(phase, [0.0, 0.0])
        entry[0] += wall
        entry[1] += cpu

    def snapshot(self) -> dict[str, tuple[float, float]]:
        """The totals up to now (the running phase charged)."""
        self._charge()
        return {k: (v[0], v[1]) for k, v in self.totals.items()}

    def since(self, mark: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
        """Wall and CPU per phase since ``mark`` (a ``snapshot``), rounded to 0.1 ms."""
        now = self.snapshot()
        out = {}
        for k, (wall, cpu) in now.items():
            w0, c0 = mark.get(k, (0.0, 0.0))
            if wall - w0 > 0 or cpu - c0 > 0:
                out[k] = [round(wall - w0, 4), round(cpu - c0, 4)]
        return out

    def write(self, path: Path | str, **about: object) -> None:
        """The totals as JSON (``load_totals`` reads them); never raises. Written aside and renamed
        into place: the launcher takes a phases file newer than the last record as that rank's
        last act (``LaunchFollower.finished``) and ends the launch without waiting, so a file
        truncated in place and not yet written was read as empty, or left so by the teardown."""
        path = Path(path)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"pid": os.getpid(), "writer": writer_id(), **about, "phases": self.snapshot()}))
            os.replace(tmp, path)


#: this process's clock
CLOCK = PhaseClock()


def _start_ticks() -> int | None:
    """This process's start time in clock ticks since boot (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def writer_id() -> str:
    """Which process wrote a phases file: its pid and start time. A pid alone repeats: a suite
    that starts thousands of processes and threads wraps the pid range (32,768 on the project's machine), so a
    referee started late can get the pid of a server that has ended."""
    return f"{os.getpid()}@{_start_ticks()}"


def process_age() -> tuple[float, float]:
    """(wall, CPU) seconds since this process started (Linux: ``/proc``; elsewhere the wall is 0)."""
    cpu, ticks = time.process_time(), _start_ticks()
    try:
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")), cpu
    except (TypeError, OSError, ValueError, AttributeError):
        return 0.0, cpu


def read_totals(path: Path | str) -> dict[str, list[float]]:
    """One process's totals (``PhaseClock.write``); {} where there are none."""
    try:
        return {k: [float(w), float(c)] for k, (w, c) in json.loads(Path(path).read_text())["phases"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def fold(phases: dict[str, list[float]], waited: str, inner: dict[str, list[float]]) -> dict[str, list[float]]:
    """``phases`` with the time spent waiting in ``waited`` for another process shown as that
    process's own phases (``inner``); what the wait took beyond them (fork, exit) stays in
    ``waited``, so the walls still add up to the same."""
    if waited not in phases or not inner:
        return phases
    out = {k: list(v) for k, v in phases.items()}
    wall, cpu = out.pop(waited)
    for k, (w, c) in inner.items():
        entry = out.setdefault(k, [0.0, 0.0])
        entry[0], entry[1] = round(entry[0] + w, 4), round(entry[1] + c, 4)
    rest = wall - sum(w for w, _ in inner.values())
    if rest > 0:  # added to what the inner process spent in a phase of the same name
        entry = out.setdefault(waited, [0.0, 0.0])
        entry[0], entry[1] = round(entry[0] + rest, 4), round(entry[1] + cpu, 4)
    return out


def load_totals(folders: list[Path]) -> tuple[dict[str, list[float]], int]:
    """Wall and CPU per phase over every phases file in ``folders`` (every rank process, forked
    cell process and referee of their launches: a referee writes one per reference), and how
    many processes wrote them."""
    totals: dict[str, list[float]] = {}
    writers: set[tuple[str, object]] = set()
    for folder in folders:
        for path in sorted(Path(folder).glob("*.phases")):
            try:
                data = json.loads(path.read_text())
                phases = data["phases"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            writers.add((str(folder), data.get("writer", data.get("pid", path.name))))
            for k, (wall, cpu) in phases.items():
                entry = totals.setdefault(k, [0.0, 0.0])
                entry[0] += wall
                entry[1] += cpu
    return totals, len(writers)


def record_sum(phases: dict[str, list[float]] | None) -> float:
    """The wall seconds a record's ``phases`` add up to (compare with its ``duration_s``)."""
    return sum(wall for wall, _ in (phases or {}).values())


def format_table(columns: dict[str, dict[str, list[float]]]) -> str:
    """Phases as rows, one (wall, CPU) pair of columns per named breakdown, with a total row."""
    names = [k for k in CATEGORIES if any(k in c for c in columns.values())]
    names += sorted({k for c in columns.values() for k in c} - set(names))
    head = f"{'phase':<16}" + "".join(f" | {name[:21]:>21}" for name in columns)
    sub = f"{'':<16}" + "".join(f" | {'wall s':>10} {'CPU s':>10}" for _ in columns)
    lines = [head, sub, "-" * len(sub)]
    for k in [*names, "total"]:
        cells = []
        for c in columns.values():
            wall, cpu = (sum(v[0] for v in c.values()), sum(v[1] for v in c.values())) if k == "total" \
                else c.get(k, (0.0, 0.0))
            cells.append(f" | {wall:10.2f} {cpu:10.2f}")
        lines.append(f"{k:<16}" + "".join(cells))
    return "\n".join(lines)
