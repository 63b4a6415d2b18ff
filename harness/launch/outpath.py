"""Where a run writes: the records file and the launch folder, made ready before anything
starts, or a ``ValueError`` (one line) naming why they cannot be; and what a launch handed
between its processes, dropped once the launch is over (``drop_handoff``).

The launch folder is kept bounded: each run's start removes the files of launches beyond the
newest ``KEEP_LAUNCHES`` (and what launches before ``drop_handoff`` left of their hand-off),
never of a launch whose plan, log or progress moved in the last ``IDLE_S`` (another run may be in
it) nor of one whose log a record in the run's records (or those it reuses) names (a cell its
launch could not finish: the record keeps the log's tail too). The rest are diagnostics (log,
plan, progress, phases, crashes).

The references kept for later runs (``KEPT_REFERENCES``, ``harness.train.reuse``) are kept
to ``KEPT_BYTES``: each run's start removes the least recently used beyond it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from harness.protocol import KEPT_REFERENCES, LaunchPlan

__all__ = ["IDLE_S", "KEEP_LAUNCHES", "KEPT_BYTES", "drop_handoff", "prepare_out"]

#: launches whose files a launch folder keeps (one a version per ``nox -s matrix``, more after a relaunch)
KEEP_LAUNCHES = 20
#: a launch that wrote a file this recently is left alone, whatever its age
IDLE_S = 3600.0
#: the references a launch folder keeps for later runs, in bytes (a fresh 2.13 CPU suite leaves 27 MB)
KEPT_BYTES = 128 << 20
#: a launch's plan file (``harness.protocol.LaunchPlan.plan_file``): ``<run id>-L<n>[-<hex>].json``
_PLAN = re.compile(r"(?P<launch>.+-L\d+(?:-[0-9a-f]{6})?)\.json")
#: the launch a file of the folder belongs to: its name up to the first dot after the launch id
_OWNER = re.compile(r"(?P<launch>.+?-L\d+(?:-[0-9a-f]{6})?)\.")
#: what a launch hands between its processes (``drop_handoff``), by name
_HANDOFF = re.compile(r"\.cell\d+\.(?:observed(?:\.pt)?|verdict\.json)|\.references")  # .pt: before the handoff format


def prepare_out(out: Path, log_dir: Path, reuse_from: list[str] | tuple[str, ...] = ()) -> None:
    """Create ``out``'s folder, ``log_dir`` and ``out`` itself (appended to later); prune ``log_dir``,
    keeping the launches the records of ``out`` and ``reuse_from`` name."""
    for folder in (out.parent, log_dir):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            blocker = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
            why = f"{blocker} is a file, not a folder" if blocker else (e.strerror or type(e).__name__)
            raise ValueError(f"--out {out}: cannot create the folder {folder}: {why}") from None
    _prune(log_dir, records=[out, *map(Path, reuse_from)])
    _prune_kept(log_dir / KEPT_REFERENCES)
    try:
        with open(out, "a"):
            pass
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write it: {e.strerror or type(e).__name__}") from None


def drop_handoff(plan: LaunchPlan) -> None:
    """Remove what ``plan``'s launch handed between its processes: each cell's snapshots of
    FSDP2 for its reference, its verdict back, the references its later cells reused. About
    100 MB a version in a fresh CPU matrix, read by nothing once the records are written (the
    record holds the verdict; ``--dump`` keeps the snapshots). The plan, log, progress, phase
    and crash files stay."""
    if plan.config.node_rank != 0:  # node 0 judges, and may still read them where the folder is shared
        return
    for cell in plan.cells:
        plan.observed_file(cell.index).unlink(missing_ok=True)
        plan.verdict_file(cell.index).unlink(missing_ok=True)
    shutil.rmtree(plan.references_folder(), ignore_errors=True)


def _prune(log_dir: Path, *, keep: int = KEEP_LAUNCHES, idle_s: float = IDLE_S, records: Sequence[Path] = ()) -> None:
    """Remove the files of ``log_dir``'s launches beyond the newest ``keep`` and the hand-off
    of the others, leaving alone any launch that wrote within ``idle_s`` and any whose log a
    record of ``records`` names (the launcher's record of a cell its launch could not finish);
    what cannot be removed stays."""
    try:
        entries = list(log_dir.iterdir())
    except OSError:
        return
    @functools.cache
    def named() -> str:  # the records' text, read once, where a launch beyond the newest may go
        return "".join(_text(f) for f in records)

    launches: dict[str, list[Path]] = {m["launch"]: [] for e in entries if (m := _PLAN.fullmatch(e.name))}
    for e in entries:
        if (m := _OWNER.match(e.name)) and m["launch"] in launches:
            launches[m["launch"]].append(e)

    def last_write(launch: str) -> float:  # its plan, log and progress: the progress moves at each cell's start
        times = [0.0]
        for f in (log_dir / f"{launch}.{x}" for x in ("json", "log", "progress")):
            with contextlib.suppress(OSError):  # gone meanwhile (another run pruning)
                times.append(f.stat().st_mtime)
        return max(times)

    now, written = time.time(), {launch: last_write(launch) for launch in launches}
    for n, launch in enumerate(sorted(launches, key=written.__getitem__, reverse=True)):
        files = launches[launch]
        if now - written[launch] < idle_s:
            continue
        whole = n >= keep and f"{launch}.log" not in named()
        for f in files if whole else [f for f in files if _HANDOFF.fullmatch(f.name[len(launch):])]:
            if f.is_dir() and not f.is_symlink():
                shutil.rmtree(f, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    f.unlink()


def _prune_kept(folder: Path, limit: int = KEPT_BYTES) -> None:
    """Remove the least recently used of ``folder``'s references (a reuse renews a file's time)
    until the rest fit in ``limit`` bytes, and what a writer that died left half written."""
    sized = []
    for f in folder.glob("*") if folder.is_dir() else ():
        with contextlib.suppress(OSError):
            st = f.stat()
            if f.name.endswith(".tmp") and time.time() - st.st_mtime > IDLE_S:
                f.unlink()
            elif not f.name.endswith(".tmp"):
                sized.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in sized)
    for _, size, f in sorted(sized, key=lambda x: x[0]):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            f.unlink()
        total -= size


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
