"""Pay only for what changed: a cell whose inputs (``harness.plan.inputs``) equal those of a
record already in the run's records file is answered by that record instead of run.

The newest record with the cell's key is reused when it was as expected, neither it nor
the cell's documentation is a hang or a crash, and, for a cell that installs patches, every
piece of the module under test's code that ran in it (``code_deps``,
``harness.undertest.code_ran``) hashes the same in the source as it is now (those always run: they are the outcomes a
rerun must confirm). The reused record is written again for this run, saying where it came
from (``reused_from``: the run id and start time of the run that measured it; a record
reused again keeps the first). ``--fresh`` (``fresh: true`` in ``matrix.yaml``), ``--shuffle``
and ``--dump`` run everything.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from harness.plan.cells import Cell
from harness.results.record import Record, append
from harness.results.reusable import reusable_records
from harness.runconfig import RunConfig
from harness.undertest.code_ran import CodeIndex

__all__ = ["known", "reuse"]


def known(config: RunConfig, out: Path) -> dict[str, Record]:
    """The records ``config``'s run may reuse, by key: the newest as-expected one of each in its
    ``--reuse-from`` files and in ``out`` (none where it runs everything)."""
    if config.runs_everything:
        return {}
    return reusable_records(*map(Path, config.reuse_from), out)


def reuse(cells: list[Cell], config: RunConfig, out: Path, source: Path | None = None,
          records: dict[str, Record] | None = None) -> tuple[list[Record], list[Cell]]:
    """The records reused for ``cells`` (already appended to ``out``), and the cells to run;
    ``source``: the module under test's folder (or file); ``records``: what ``known`` read
    (None: read now)."""
    if config.runs_everything:
        return [], cells
    found = known(config, out) if records is None else records
    code = CodeIndex(source) if source is not None else None
    reused: list[Record] = []
    to_run: list[Cell] = []
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for cell in cells:
        old = found.get(cell.inputs) if cell.inputs else None
        if old is None or cell.may_end_process or (cell.patches and not _same_code(old, code)):
            to_run.append(cell)
            continue
        rec = dataclasses.replace(old, run_id=config.run_id or "", launch_id="reused", cell=cell.index, started_at=now,
                                  reused_from=old.reused_from or {"run_id": old.run_id, "started_at": old.started_at})
        reused.append(rec)
    if reused:
        append(out, *reused)  # one write: all of them are on disk before any cell starts
    return reused, to_run


def _same_code(rec: Record, code: CodeIndex | None) -> bool:
    """Whether the module under test's code that ran in ``rec``'s cell is unchanged (a record
    that does not say what ran never is)."""
    return code is not None and bool(rec.code_deps) and code.unchanged(rec.code_deps)
