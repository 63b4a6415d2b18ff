"""Which records a rerun may reuse (``harness.launch.incremental``), read without torch: nox's
own process carries them over (``carry_over``) before ``nox -s matrix`` replaces a version's
records file."""

from __future__ import annotations

import os
from pathlib import Path

from harness.results.reading import load_records
from harness.results.record import Record, RecordError

__all__ = ["ALWAYS_RUN", "carry_over", "reusable_records"]

#: outcomes a rerun must confirm: never reused
ALWAYS_RUN = frozenset({"hang", "crash"})


def reusable_records(*paths: Path) -> dict[str, Record]:
    """The newest as-expected record of each input key in the records files ``paths`` (a later
    file's records are the newer)."""
    newest: dict[str, Record] = {}
    for path in paths:
        if not path.is_file():
            continue
        try:
            found, _ = load_records([path])
        except RecordError:
            continue
        for rec, _ in found:
            if rec.inputs:
                newest[rec.inputs] = rec  # file order: the last one wins, as expected or not
    return {k: r for k, r in newest.items() if r.as_expected and r.status not in ALWAYS_RUN}


def carry_over(out: Path) -> Path | None:
    """Before a run replaces the records file ``out`` (``nox -s matrix``: one file per torch
    version, a rerun's records in place of the last run's): what the rerun may reuse, from
    ``out`` and from what an earlier replacement kept, newest per key, in ``<out>.previous``
    (no ``*.jsonl`` search finds it). That file, or None where nothing is reusable."""
    previous = out.with_name(out.name + ".previous")
    keep = reusable_records(previous, out)
    if not keep:
        previous.unlink(missing_ok=True)
        return None
    partial = previous.with_name(previous.name + ".partial")
    partial.write_text("".join(rec.to_json() + "\n" for rec in keep.values()))
    os.replace(partial, previous)
    return previous
