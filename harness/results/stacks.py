"""The report's "Public stacks" section: stack × patch function × torch -> what to do with it.

For each ``Judged`` function of each stack entry (``harness.undertest.stacks``), its records
(``<folder>/<stack>/<judged key>/*.jsonl``, written by ``harness stacks run``) are judged like
any patches module's: the status of its patch name per torch version (needed, retire, use
public API, backport, broken, ...), with the cells that decided it. A function that cannot be
judged on CPU is "not applicable on CPU" with the reason; one without records, "not run".
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.results.tables import build_tables
from harness.undertest.stacks import Stack
from harness.versions import sorted_torch
from harness.vocabulary import PS_NOT_APPLICABLE, PS_NOT_RUN

__all__ = ["NOT_ON_CPU", "stack_rows", "status_class"]

NOT_ON_CPU = "not applicable on CPU"


def stack_rows(folder: Path, stacks: list[Stack], device: str = "cpu",
               versions: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(statuses, the cells behind each status, notes): one row per stack function, one
    column per torch version."""
    rows, details, notes = [], [], []
    found: dict[tuple[str, str], pd.DataFrame] = {}
    for stack in stacks:
        for judged in stack.judged:
            where = Path(folder) / stack.name / judged.key
            if any(where.glob("*.jsonl")):
                patches = build_tables([where]).patches
                found[(stack.label, judged.function)] = patches[(patches["patch"] == judged.patch)
                                                               & (patches["device"] == device)]
    columns = versions or sorted_torch({t for f in found.values() for t in f["torch"]})
    for stack in stacks:
        for judged in stack.judged:
            head = {"stack": stack.label, "function": judged.function, "bugs": judged.bugs, "as patch": judged.patch}
            mine = found.get((stack.label, judged.function))
            status = {v: PS_NOT_RUN for v in columns}
            detail = {v: "" for v in columns}
            if device == "cpu" and judged.cpu:
                status = {v: NOT_ON_CPU for v in columns}
                notes.append(f"{stack.label} {judged.function}: {NOT_ON_CPU}: {judged.cpu}.")
            elif mine is not None:
                for r in mine.to_dict("records"):
                    if r["torch"] in status:
                        status[r["torch"]], detail[r["torch"]] = r["status"], r["detail"]
            rows.append({**head, **status})
            details.append({**head, **detail})
    return pd.DataFrame(rows), pd.DataFrame(details), notes


def status_class(status: str) -> str:
    """The patch-status colour class a cell of the table takes."""
    return PS_NOT_APPLICABLE if status == NOT_ON_CPU else status
