"""Reading records back: the files and folders given (``*.jsonl`` under folders), every
valid record with its source, and each line that is not one, with why."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.results.record import Record, RecordError

__all__ = ["expand_paths", "load_records"]


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given plus ``*.jsonl`` found (recursively) under folders."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise RecordError(f"no such file or folder: {path}")
    return files


def load_records(paths: Iterable[str | Path]) -> tuple[list[tuple[Record, str]], list[str]]:
    """Valid records with their source ("file:line"), and the skipped lines as "file:line: reason"."""
    found: list[tuple[Record, str]] = []
    skipped: list[str] = []
    for path in expand_paths(paths):
        try:
            lines = path.read_bytes().splitlines()
        except OSError as exc:
            raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from exc
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                found.append((Record.from_json(raw.decode("utf-8")), f"{path}:{lineno}"))
            except UnicodeDecodeError:
                skipped.append(f"{path}:{lineno}: not UTF-8")
            except RecordError as exc:
                skipped.append(f"{path}:{lineno}: {exc}")
    return found, skipped

