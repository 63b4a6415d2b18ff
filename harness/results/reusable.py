"""Which records a rerun may reuse (``harness.launch.incremental``), read without torch: nox's
own process carries them over (``carry_over``) before ``nox -s matrix`` replaces a version's
records file."""

from __future__ import annotations

import collections
import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from harness.results.record import Record, RecordError

__all__ = ["ALWAYS_RUN", "KEYS_PER_CELL", "carry_over", "reusable_records"]

#: outcomes a rerun must confirm: never reused
ALWAYS_RUN = frozenset({"hang", "crash"})

#: the fields that name a cell, whatever its inputs
_CELL_FIELDS = ("scenario", "variant", "world_size", "device", "backend", "init", "fault")


def reusable_records(*paths: Path) -> dict[str, Record]:
    """The newest as-expected record of each input key in the records files ``paths`` (a later
    file's records are the newer)."""
    reusable = {}
    for key, (_, raw, ok) in _newest(paths).items():
        if ok:
            with contextlib.suppress(RecordError, UnicodeDecodeError):
                reusable[key] = Record.from_json(raw.decode("utf-8"))
    return reusable


def _newest(paths: Iterable[Path]) -> dict[str, tuple[tuple, bytes, bool]]:
    """The newest line of each input key in the records files ``paths`` (a later file's, and a
    later line's, are the newer), oldest first: (the fields naming its cell, the line, whether
    it may be reused: as expected, not a hang or crash). A line that is no JSON or has no key
    is passed over."""
    newest: dict[str, tuple[tuple, bytes, bool]] = {}
    for path in paths:
        with contextlib.suppress(OSError):
            for raw in path.read_bytes().splitlines():
                try:
                    row = json.loads(raw)
                    key = row["inputs"]
                except (ValueError, TypeError, KeyError):
                    continue
                if not isinstance(key, str) or not key:
                    continue
                newest.pop(key, None)  # insertion order is age: the last one seen is the newest
                ok = row.get("as_expected") is True and row.get("status") not in ALWAYS_RUN
                newest[key] = (tuple(json.dumps(row.get(f)) for f in _CELL_FIELDS), raw, ok)
    return newest


#: how many input keys of one cell a carried-over file keeps (the newest): enough to go back
#: to the last state after trying an edit, without the file growing by a whole run at each
#: change of the harness or torch (every key new)
KEYS_PER_CELL = 2

def carry_over(out: Path) -> Path | None:
    """Before a run replaces the records file ``out`` (``nox -s matrix``: one file per torch
    version, a rerun's records in place of the last run's): what the rerun may reuse, from
    ``out`` and from what an earlier replacement kept, newest per key and at most
    ``KEYS_PER_CELL`` keys a cell, in ``<out>.previous`` (no ``*.jsonl`` search finds it). That
    file, or None where nothing is reusable. The lines are copied as they are: ``harness run``
    reads them as records when it reuses them (and skips any that is not one)."""
    previous = out.with_name(out.name + ".previous")
    newest = _newest([previous, out])
    kept: list[bytes] = []
    per_cell: collections.Counter = collections.Counter()
    for cell, raw, ok in reversed(newest.values()):
        if ok and per_cell[cell] < KEYS_PER_CELL:
            per_cell[cell] += 1
            kept.append(raw)
    if not kept:
        previous.unlink(missing_ok=True)
        return None
    partial = previous.with_name(previous.name + ".partial")
    partial.write_bytes(b"".join(raw + b"\n" for raw in reversed(kept)))
    os.replace(partial, previous)
    return previous
