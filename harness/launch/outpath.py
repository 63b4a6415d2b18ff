"""Where a run writes: the records file and the launch folder, made ready before anything
starts, or a ``ValueError`` (one line) naming why they cannot be."""

from __future__ import annotations

from pathlib import Path

__all__ = ["prepare_out"]


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
