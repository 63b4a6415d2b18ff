"""Where a run writes: the records file and the launch folder, made ready before anything
starts, or a ``ValueError`` (one line) naming why they cannot be; and what a launch handed
between its processes, dropped once the launch is over (``drop_handoff``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.protocol import LaunchPlan

__all__ = ["drop_handoff", "prepare_out"]


def prepare_out(out: Path, log_dir: Path) -> None:
    """Create ``out``'s folder, ``log_dir`` and ``out`` itself (appended to later)."""
    for folder in (out.parent, log_dir):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            blocker = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
            why = f"{blocker} is a file, not a folder" if blocker else (e.strerror or type(e).__name__)
            raise ValueError(f"--out {out}: cannot create the folder {folder}: {why}") from None
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
    for cell in plan.cells:
        plan.observed_file(cell.index).unlink(missing_ok=True)
        plan.verdict_file(cell.index).unlink(missing_ok=True)
    shutil.rmtree(plan.references_folder(), ignore_errors=True)
