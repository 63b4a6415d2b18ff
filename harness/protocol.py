"""The launcher <-> worker protocol, in one place.

The launcher (``harness.launch``) and the ranks (``harness.rank``) share nothing but
files in a launch folder and torchrun's store. This module is everything they agree on:

* the **launch plan** (``LaunchPlan``): one JSON file the launcher writes and every rank
  reads: the cells, their stages and slots, where records go;
* the **files beside it**, all named ``<launch_id>.*`` in the launch folder: the log
  (what the ranks print), the **progress** file (one JSON line per cell start, with the
  global ranks that run it), and per rank a **phase** file (where the rank is now: the
  launcher reads it after a kill to say where each rank was), a **crash** file
  (faulthandler's report on a fatal signal), an **exit** file (the exit code and phase when
  code under test ends the rank with ``os._exit``), and what the reference process reads;
* the **phase** vocabulary (``phase_key`` orders phases: a hang is blamed on the rank behind);
* the **store keys** through which the ranks of a cell agree on its outcome
  (``CellKeys``) and the ranks of a launch meet at the end of a stage (``stage_done``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.plan.cells import Cell
from harness.plan.placement import Stage
from harness.results.record import append_line
from harness.runconfig import RunConfig

__all__ = [
    "IDLE", "KEPT_REFERENCES",
    "SETUP_PHASES",
    "CellKeys",
    "LaunchPlan",
    "ProgressEvent",
    "RankExit",
    "install_phase",
    "mark_started",
    "parse_progress",
    "phase_key",
    "phase_words",
    "read_exit",
    "read_phase",
    "stage_done",
    "step_phase",
    "write_exit",
    "write_phase",
]


# --------------------------------------------------------------------------- the plan

KEPT_REFERENCES = "references"  # a launch folder's references kept for later runs (harness.train.reuse)

@dataclass(kw_only=True)
class LaunchPlan:
    """What one torchrun launch runs; written as JSON for the workers."""

    #: the run's configuration (``harness.runconfig``), its folders resolved: every rank reads its options here
    config: RunConfig
    run_id: str
    launch_id: str
    device: str
    world_size: int
    #: how records name the module under test (``harness.undertest.source.PatchSource.describe``)
    patches_module_id: str
    #: the records file every judging rank appends to
    out_path: str
    #: the launch folder: the plan, log, progress, phase and crash files
    folder: str
    cells: list[Cell] = field(default_factory=list)
    #: the order and slots the cells run in (``harness.plan.placement``)
    stages: list[Stage] = field(default_factory=list)

    def cell(self, index: int) -> Cell:
        return next(c for c in self.cells if c.index == index)

    def _file(self, suffix: str) -> Path:
        return Path(self.folder) / f"{self.launch_id}.{suffix}"

    @property
    def plan_file(self) -> Path:
        return self._file("json")

    @property
    def log_file(self) -> Path:
        return self._file("log")

    @property
    def progress_file(self) -> Path:
        return self._file("progress")

    def stamp_file(self, rank: int) -> Path:
        """Where global rank ``rank`` stamps its phase (``write_phase``)."""
        return self._file(f"rank{rank}.phase")

    def crash_file(self, rank: int) -> Path:
        """Where a rank's faulthandler writes if a fatal signal (SIGABRT, SIGSEGV, ...) kills it."""
        return self._file(f"rank{rank}.crash")

    def exit_file(self, rank: int) -> Path:
        """Where a rank notes that code under test ended it (``write_exit``)."""
        return self._file(f"rank{rank}.exit")

    def slot_file(self, rank: int, what: str) -> Path:
        """``done``: the last cell global rank ``rank`` posted; ``quiet``: since when it sat blocked (``harness.rank.deadlock``)."""
        return self._file(f"rank{rank}.{what}")

    def phase_times_file(self, rank: int, cell: int | None = None, what: str = "cell") -> Path:
        """Where a rank's process (or the process forked for ``cell``: ``what`` is "cell" or
        "reference") writes its time per phase (``harness.rank.phases``)."""
        return self._file(f"rank{rank}.phases" if cell is None else f"rank{rank}.{what}{cell}.phases")

    def observed_file(self, cell: int) -> Path:
        """What FSDP2 produced in ``cell`` (its judge's snapshots, ``harness.rank.handoff``), for the reference process."""
        return self._file(f"cell{cell}.observed")

    def verdict_file(self, cell: int) -> Path:
        """The referee's outcome of ``cell`` (``CellOutcome.to_json``)."""
        return self._file(f"cell{cell}.verdict.json")

    def references_folder(self) -> Path:
        """The references this launch's cells computed, for its later cells to reuse (``harness.train.reuse``)."""
        return self._file("references")

    def dump(self) -> Path:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        data = {**asdict(self), "config": self.config.to_json()}
        self.plan_file.write_text(json.dumps(data, indent=1))
        self.progress_file.write_text("")
        return self.plan_file

    @classmethod
    def load(cls, path: str | Path) -> LaunchPlan:
        data = json.loads(Path(path).read_text())
        data["cells"] = [Cell.from_dict(c) for c in data["cells"]]
        data["stages"] = [Stage(**s) for s in data["stages"]]
        data["config"] = RunConfig.from_json(data["config"])
        return cls(**data)


# --------------------------------------------------------------------------- progress


@dataclass(kw_only=True, frozen=True)
class ProgressEvent:
    """One line of the progress file: a cell started at ``t`` on these global ranks."""

    cell: int
    t: float
    ranks: tuple[int, ...]


def mark_started(path: str | Path, cell: int, ranks: list[int]) -> None:
    """Append a cell start (its slot's first rank calls this as the cell begins)."""
    append_line(path, json.dumps({"cell": cell, "event": "start", "t": time.time(), "ranks": ranks}))


def parse_progress(line: str) -> ProgressEvent | None:
    """A progress line as an event (None for any other event kind)."""
    data = json.loads(line)
    if data.get("event") != "start":
        return None
    return ProgressEvent(cell=int(data["cell"]), t=float(data["t"]), ranks=tuple(data.get("ranks", ())))


# --------------------------------------------------------------------------- phases

#: a rank between cells
IDLE = "idle"
#: a cell's phases before training, in order
SETUP_PHASES = ("import patches", "install patches", "init group", "build model")
#: the phase of the judge's reference run
REFERENCE = "reference"


def install_phase(patch: str) -> str:
    """``install patches: <patch>``: the install of one patch of the set."""
    return f"{SETUP_PHASES[1]}: {patch}"


def phase_words(phase: str | None) -> str:
    """A phase as the end of a sentence: ``during install of patch X``, ``between cells``."""
    if not phase or phase == IDLE:
        return "between cells"
    if phase.startswith(f"{SETUP_PHASES[1]}: "):
        return f"during install of patch {phase.split(': ', 1)[1]}"
    if phase == SETUP_PHASES[0]:
        return "during import of the patches module"
    return f"during {phase!r}"


def step_phase(step: int, what: str, micro_batch: int | None = None) -> str:
    """``step 0 micro-batch 1 backward``, ``step 2 clip``, ``step 2 gather snapshots``."""
    return f"step {step} micro-batch {micro_batch} {what}" if micro_batch is not None else f"step {step} {what}"


def write_phase(path: Path, phase: str) -> None:
    path.write_text(json.dumps({"phase": phase, "t": time.time()}))


def read_phase(path: Path) -> str | None:
    """The phase a rank last stamped, or None."""
    try:
        return json.loads(path.read_text())["phase"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def phase_key(phase: str | None) -> tuple[Any, ...]:
    """Sort key of a phase: a rank with a smaller key is behind (did not arrive)."""
    if not phase or phase == IDLE:
        return (-1,)
    if phase in SETUP_PHASES:
        return (SETUP_PHASES.index(phase),)
    if phase.startswith(f"{SETUP_PHASES[1]}: "):
        return (SETUP_PHASES.index(SETUP_PHASES[1]),)
    if phase == REFERENCE:
        return (9,)
    words = phase.split()
    if words[0] == "step" and len(words) >= 3 and words[1].isdigit():
        step = int(words[1])
        if words[2] == "micro-batch" and len(words) >= 4 and words[3].isdigit():
            return (5, step, int(words[3]), 1 if words[-1] == "backward" else 0)
        return (5, step, 10**6, tuple(words[2:]))
    return (8, phase)


@dataclass(kw_only=True, frozen=True)
class RankExit:
    """Code under test ended a rank: its exit code, and the rank's phase then."""

    code: int
    phase: str | None


def write_exit(path: Path, code: int, phase: str | None) -> None:
    path.write_text(json.dumps({"code": code, "phase": phase, "t": time.time()}))


def read_exit(path: Path) -> RankExit | None:
    """The exit a rank noted, or None (none, or unreadable)."""
    try:
        data = json.loads(path.read_text())
        return RankExit(code=int(data["code"]), phase=data.get("phase"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# --------------------------------------------------------------------------- store keys


@dataclass(kw_only=True, frozen=True)
class CellKeys:
    """The store keys of one cell of one launch."""

    launch_id: str
    index: int

    @property
    def prefix(self) -> str:
        return f"{self.launch_id}/{self.index}"

    def status(self, rank: int) -> str:
        """Rank ``rank`` (of the cell's slot) posts its ``RankOutcome`` here."""
        return f"{self.prefix}/status/{rank}"

    @property
    def recorded(self) -> str:
        """Set by the judge once the cell's record is on disk."""
        return f"{self.prefix}/recorded"

    @property
    def keep_group(self) -> str:
        """Set by the judge before ``recorded``: "1" when the slot keeps its default group
        for its next cell (``harness.rank.groups``), "0" when every rank destroys it."""
        return f"{self.prefix}/keep_group"

    @property
    def healthy(self) -> str:
        """Set by the judge before ``recorded``: "1" when every rank of the slot reported and
        none failed, so answers the cell measured may be kept (``harness.rank.groups.ProbeCache``)."""
        return f"{self.prefix}/healthy"

    @property
    def abandoned(self) -> str:
        """Set by the judge when a rank never reported: the launch must end."""
        return f"{self.prefix}/abandoned"

    @property
    def group(self) -> str:
        """The prefix of the cell's own process group (a ``PrefixStore``)."""
        return f"{self.prefix}/pg"


def stage_done(launch_id: str, stage: int, rank: int) -> str:
    """Set by each global rank when it has run its slot's cells of ``stage``."""
    return f"{launch_id}/stage{stage}/{rank}"
