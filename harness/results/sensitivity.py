"""The scenarios' blind spots: what a fault injected on the FSDP2 side (``run --fault``,
``harness.train.faults``) changed that no check of the scenario flagged.

Every cell documented to pass runs once more per fault; it must become a mismatch that
flags every parameter whose step-0 grad the fault changed. The table has a row per
scenario and a column per fault: ``caught k/k`` where every cell did, else the cells that
did not and what they missed.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from harness.results.record import Record
from harness.vocabulary import FAULT_NAMES

__all__ = ["blind_spots", "blind_spot_lines"]


def blind_spots(records: Iterable[Record]) -> pd.DataFrame:
    """Scenario x fault -> what the cells of that scenario made of the fault (see the module's docstring)."""
    cells: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        if r.fault is not None:
            cells.setdefault((r.scenario, r.fault), []).append(r)
    if not cells:
        return pd.DataFrame()
    faults = [f for f in FAULT_NAMES if any(f == k[1] for k in cells)]
    rows = []
    for scenario in sorted({k[0] for k in cells}):
        row = {"scenario": scenario}
        for fault in faults:
            row[fault] = _verdict(cells.get((scenario, fault), []))
        rows.append(row)
    return pd.DataFrame(rows, columns=["scenario", *faults])


def _verdict(records: list[Record]) -> str:
    if not records:
        return ""
    judged = [r for r in records if r.status != "skip"]
    caught = [r for r in judged if r.as_expected]
    text = f"caught {len(caught)}/{len(judged)}" if judged else "skipped"
    misses = [f"{r.variant} w{r.world_size}: {_what(r)}" for r in judged if not r.as_expected]
    return text + ("; " + "; ".join(misses[:3]) + (" ..." if len(misses) > 3 else "") if misses else "")


def _what(r: Record) -> str:
    if r.fault_missed:
        return "missed " + ", ".join(r.fault_missed[:3]) + (" ..." if len(r.fault_missed) > 3 else "")
    if r.status == "pass":
        return "passed"
    return f"{r.status}" + (f" ({(r.exc_msg or '').splitlines()[0][:80]})" if r.exc_msg else "")


def blind_spot_lines(frame: pd.DataFrame) -> list[str]:
    """What the report says under its table: each scenario's blind spots, or that there are none."""
    if frame.empty:
        return []
    spots = [f"{row['scenario']}, {fault}: {text}" for row in frame.to_dict("records")
             for fault, text in row.items() if fault != "scenario" and "; " in text]
    return spots or ["No blind spot: every cell flagged every parameter each fault changed."]
