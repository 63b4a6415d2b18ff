"""Follow a launch from the outside: which cells started (and on which ranks), and the
records its workers appended."""

from __future__ import annotations

from pathlib import Path

from harness.protocol import parse_progress
from harness.results.record import Record, RecordError

__all__ = ["LaunchFollower"]


class LaunchFollower:
    """Reads a launch's progress file and the records file as they grow."""

    def __init__(self, *, progress_path: Path, out_path: Path, launch_id: str) -> None:
        self.progress_path, self.out_path, self.launch_id = progress_path, out_path, launch_id
        self.offset = out_path.stat().st_size
        self.progress_offset = 0
        self.starts: dict[int, float] = {}
        self.ranks: dict[int, list[int]] = {}
        self.recorded: set[int] = set()

    def open_cells(self) -> dict[int, float]:
        """Cells started and not recorded yet, with their start times."""
        self._read_progress()
        return {i: t for i, t in self.starts.items() if i not in self.recorded}

    def _read_progress(self) -> None:
        lines, self.progress_offset = _complete_lines(self.progress_path, self.progress_offset)
        for line in lines:
            event = parse_progress(line)
            if event is not None:
                self.starts[event.cell] = event.t
                self.ranks[event.cell] = list(event.ranks)

    def new_records(self) -> list[Record]:
        """Records of this launch appended since the last call."""
        lines, self.offset = _complete_lines(self.out_path, self.offset)
        out = []
        for line in lines:
            try:
                rec = Record.from_json(line)
            except RecordError:
                continue
            if rec.launch_id == self.launch_id:
                self.recorded.add(rec.cell)
                out.append(rec)
        self._read_progress()
        return out

    def finished(self, cells: set[int], phase_files: list[Path]) -> bool:
        """Every cell of the launch recorded, and every rank's phase times written since the last
        of them (at its last stage's end, a worker's last act before it exits): what is left of
        the launch is its processes' exit and torchrun's teardown, about a second nothing needs."""
        if not cells <= self.recorded:
            return False
        try:
            last = self.out_path.stat().st_mtime_ns
            return all(p.stat().st_mtime_ns >= last for p in phase_files)
        except OSError:  # a rank's file not written yet
            return False


def _complete_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines appended to ``path`` since byte ``offset`` (a line still being
    written waits for the next call), and the offset after them."""
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return complete.decode("utf-8").splitlines(), offset + len(complete)
