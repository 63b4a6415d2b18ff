"""The commands that read records (``report``, ``diff``, ``prerelease``, ``blind-spots``), as plain functions:
``harness.cli`` parses their arguments and calls them once pandas, tabulate and jinja2 are
known to be there. Each returns the exit code: 1 when something got worse, else 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.results.diff import diff_runs, load_side, prerelease_lane
from harness.results.report import with_stacks, write_outputs
from harness.results.tables import build_tables

__all__ = ["blind_spots", "diff", "prerelease", "report"]

EXIT_WORSE = 1


def report(records: Sequence[str], out: str, stacks: str | None = None) -> int:
    """compat.{md,html,csv} and compat-patches.csv in ``out`` (with ``stacks``' records, the
    Public stacks section and compat-stacks.csv); prints their paths."""
    tables = with_stacks(build_tables(records), stacks)
    written = write_outputs(tables, out)
    if tables.skipped:
        print(f"warning: skipped {len(tables.skipped)} malformed lines (listed in the report)", file=sys.stderr)
    for path in written.values():
        print(path)
    return 0


def diff(old: str, new: str, *, out: str | None, strict: bool) -> int:
    """What changed between two runs; with ``strict``, any verdict change counts as worse."""
    result = diff_runs(load_side(old), load_side(new))
    _markdown(result.markdown(), out)
    if strict:
        return EXIT_WORSE if result.verdict_changes else 0
    return EXIT_WORSE if result.got_worse else 0


def prerelease(records: Sequence[str], *, out: str | None) -> int:
    """The pre-release lane: nothing printed (and an empty ``out``) when the records hold no pre-release."""
    lane = prerelease_lane(list(records))
    _markdown(lane.markdown(), out)
    return EXIT_WORSE if lane.got_worse else 0


def blind_spots(records: Sequence[str], *, out: str | None) -> int:
    """The blind-spot table of fault runs (``run --fault``); exit 1 when a scenario missed a fault."""
    from harness.results.reading import load_records
    from harness.results.sensitivity import blind_spot_lines
    from harness.results.sensitivity import blind_spots as table

    found, _ = load_records(records)
    frame = table(r for r, _ in found)
    if frame.empty:
        raise ValueError(f"no record of a run with a fault in {', '.join(records)} (run --fault NAME)")
    lines = blind_spot_lines(frame)
    _markdown(frame.to_markdown(index=False) + "\n\n" + "\n".join(f"- {line}" for line in lines) + "\n", out)
    return EXIT_WORSE if any("; " in str(v) for v in frame.drop(columns="scenario").to_numpy().ravel()) else 0


def _markdown(text: str, out: str | None) -> None:
    print(text, end="")
    if out:
        Path(out).write_text(text)
