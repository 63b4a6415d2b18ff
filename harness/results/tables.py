"""Records -> the report's tables (pandas), each built once.

``records_frame`` (one row per record) -> ``latest_records`` (one per cell and variant,
the latest ``started_at`` wins) -> ``verdict_table`` (one row per scenario/world
size/torch/device of the grid, "not run" where records are missing) ->
``patch_summary`` and ``deployed_summary`` (the environment: ``harness.results.environment``).

The grid for a device is every (scenario, world size) seen on it x every torch version
seen on it. Torch columns sort by version number; a version's build (``+cpu``,
``+cu128``) is dropped from column heads and kept in the environment rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness.results.environment import ENV_FIELDS, environment_table
from harness.results.ledger_changes import CellKey, Summary, ledger_summaries, version_changes
from harness.results.reading import load_records
from harness.results.record import Record, RecordError
from harness.results.safe import module_label, portable
from harness.results.sensitivity import blind_spots
from harness.results.verdict import adjusted, combine_patch_statuses, patch_contributions, verdict_of
from harness.versions import release_label, sorted_torch
from harness.vocabulary import PS_BROKEN, PS_NOT_RUN, VARIANTS, VERDICTS

__all__ = [
    "CELL_KEY",
    "LONG_COLUMNS",
    "ReportTables",
    "build_tables",
    "deployed_summary",
    "device_order",
    "latest_records",
    "patch_summary",
    "records_frame",
    "verdict_counts",
    "verdict_table",
]

CELL_KEY: tuple[str, ...] = ("scenario", "torch", "device", "world_size")
LONG_COLUMNS: tuple[str, ...] = (
    "device", "scenario", "world_size", "torch", "patches", "verdict", "rule", "unexpected", "caveats",
    *(f"{v}{suffix}" for v in VARIANTS for suffix in ("", "_exc", "_max_abs_diff")),
    "worst", "reference_adjusted", "upstream", "public_api", "bug_observable", "backend", "torch_build", "patches_module",
)


def records_frame(found: Sequence[tuple[Record, str]]) -> pd.DataFrame:
    """One row per record: its fields, ``env_*`` columns, ``source`` and the ``record`` itself.

    ``torch`` is the release (build dropped); the build stays in ``env_torch``."""
    names = [f.name for f in dataclasses.fields(Record)]
    rows = [{**{n: getattr(rec, n) for n in names}, **{f"env_{k}": rec.env.get(k) for k in ENV_FIELDS},
             "source": source, "record": rec} for rec, source in found]
    frame = pd.DataFrame(rows, columns=[*names, *(f"env_{k}" for k in ENV_FIELDS), "source", "record"])
    frame["env_torch"] = [e or t for e, t in zip(frame["env_torch"], frame["torch"])]
    frame["torch"] = [release_label(t) for t in frame["torch"]]
    return frame


def latest_records(records: pd.DataFrame) -> pd.DataFrame:
    """One record per cell and variant: the latest ``started_at`` (then the later line) wins."""
    when = pd.to_datetime(records["started_at"], utc=True, errors="coerce", format="ISO8601")
    ordered = records.assign(_when=when, _order=range(len(records)))
    ordered = ordered.sort_values(["_when", "_order"], kind="stable", na_position="first")
    latest = ordered.drop_duplicates([*CELL_KEY, "variant"], keep="last")
    return latest.drop(columns=["_when", "_order"]).reset_index(drop=True)


def device_order(devices: Iterable[str]) -> list[str]:
    preferred = {"cpu": 0, "cuda": 1}
    return sorted(set(devices), key=lambda d: (preferred.get(d, 2), d))


# --------------------------------------------------------------------------- verdicts


def _first_line(text: str | None, limit: int = 200) -> str:
    if not text or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _exc_text(rec: Record | None) -> str:
    if rec is None:
        return ""
    msg = _first_line(portable(rec.exc_msg or ""))
    if rec.exc_type and msg:
        return f"{rec.exc_type}: {msg}"
    return rec.exc_type or msg or (_first_line(rec.reason) if rec.status == "skip" else "")


def _cell_row(key: tuple[str, str, str, int], records: dict[str, Record | None]) -> dict[str, Any]:
    device, scenario, torch, ws = key
    cell = verdict_of(records)
    present = [r for r in records.values() if r is not None]
    first = present[0] if present else None
    row: dict[str, Any] = {
        "device": device, "scenario": scenario, "world_size": ws, "torch": torch,
        "patches": ";".join(sorted({p for r in present for p in r.patches})),
        "verdict": cell.verdict, "rule": cell.rule.number, "unexpected": "; ".join(cell.unexpected),
        "caveats": "; ".join(cell.caveats),
        "worst": next((r.worst for r in present if r.worst and r.failed), "") or "",
        "reference_adjusted": adjusted(records),
        "upstream": next((r.upstream for r in present if r.upstream), "") or "",
        "public_api": next((r.api for r in present if r.api), "") or "",
        "bug_observable": all(r.bug_observable for r in present),
        "backend": first.backend if first else "", "torch_build": (first.env.get("torch_build") if first else "") or "",
        "patches_module": next((module_label(r.patches_module_id or r.patches_module) for r in present
                                if r.variant != "vanilla"), ""),
        "_contrib": patch_contributions(cell, records),
    }
    for v in VARIANTS:
        rec = records.get(v)
        row |= {v: rec.status if rec else "", f"{v}_exc": _exc_text(rec),
                f"{v}_max_abs_diff": rec.max_abs_diff if rec else None}
    return row


def _grid(latest: pd.DataFrame) -> list[tuple[str, str, str, int]]:
    """(device, scenario, torch, world_size) for every cell of every device's grid."""
    cells = []
    for device in device_order(latest["device"]):
        mine = latest[latest["device"] == device]
        rows = sorted(set(zip(mine["scenario"], mine["world_size"])))
        cells += [(device, s, t, ws) for s, ws in rows for t in sorted_torch(mine["torch"])]
    return cells


def _verdict_frame(latest: pd.DataFrame) -> pd.DataFrame:
    index = {(r.device, r.scenario, release_label(r.torch), r.world_size, r.variant): r for r in latest["record"]}
    rows = [_cell_row(key, {v: index.get((*key, v)) for v in VARIANTS}) for key in _grid(latest)]
    return pd.DataFrame(rows, columns=[*LONG_COLUMNS, "_contrib"])


def verdict_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Long-form verdicts, one row per grid cell (records should be ``latest_records``)."""
    return _verdict_frame(latest).drop(columns="_contrib")


def patch_summary(cells_with_contrib: pd.DataFrame) -> pd.DataFrame:
    """patch x device x torch -> combined status, the cells behind it, its public API and caveats.

    A scenario whose patch set fails together blames each patch of the set, unless another
    patch of that set is shown broken in a cell of its own (alone, or by an install error)
    on the same device and torch: then the blame is that patch's, not its partners'."""
    contrib = pd.DataFrame(
        [{"patch": patch, "device": c["device"], "torch": c["torch"], "status": status,
          "source": f"{c['scenario']} w{c['world_size']}: {status} ({why})" if why else f"{c['scenario']} w{c['world_size']}: {status}",
          "api": c["public_api"], "caveats": c["caveats"] if patch in c["patches"].split(";") else "",
          "scenario": c["scenario"], "why": why, "set": tuple(p for p in c["patches"].split(";") if p)}
         for c in cells_with_contrib.to_dict("records") for patch, (status, why) in c["_contrib"].items()],
        columns=["patch", "device", "torch", "status", "source", "api", "caveats", "scenario", "why", "set"])
    contrib = contrib[~_exonerated(contrib)]
    rows = []
    grid = cells_with_contrib[["device", "torch"]].drop_duplicates()
    for patch in sorted(set(contrib["patch"])):
        for device, torch in grid.itertuples(index=False):
            mine = contrib[(contrib["patch"] == patch) & (contrib["device"] == device) & (contrib["torch"] == torch)]
            status = combine_patch_statuses(mine["status"]) if len(mine) else PS_NOT_RUN
            strongest = mine[mine["status"] == status]
            caveats = sorted({f"{s}: {c}" for s, c in zip(mine["scenario"], mine["caveats"]) if c})
            rows.append({"patch": patch, "device": device, "torch": torch, "status": status,
                         "detail": "; ".join(strongest["source"]), "api": next((a for a in strongest["api"] if a), ""),
                         "why": "; ".join(sorted({w for w in strongest["why"] if w})), "caveats": "; ".join(caveats)})
    return pd.DataFrame(rows, columns=["patch", "device", "torch", "status", "detail", "api", "why", "caveats"])


def _exonerated(contrib: pd.DataFrame) -> pd.Series:
    """Broken contributions from a set that failed together where a partner is broken on its own."""
    broken = contrib["status"] == PS_BROKEN
    alone = contrib[broken & ((contrib["set"].map(len) <= 1) | contrib["why"].str.contains("install error"))]
    guilty = set(zip(alone["patch"], alone["device"], alone["torch"]))

    def exonerated(row) -> bool:
        if row["status"] != PS_BROKEN or len(row["set"]) <= 1 or (row["patch"], row["device"], row["torch"]) in guilty:
            return False
        return any((p, row["device"], row["torch"]) in guilty for p in row["set"] if p != row["patch"])

    return contrib.apply(exonerated, axis=1).astype(bool) if len(contrib) else broken


def deployed_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """How the set users ship fares: per device and torch, deployed cells run and those not as documented."""
    rows = []
    for (device, torch), g in cells.groupby(["device", "torch"], sort=False):
        ran = g[g["deployed"] != ""]
        bad = ran[ran["verdict"].isin(["deployed set broken"]) | ran["unexpected"].str.contains("deployed")]
        rows.append({"device": device, "torch": torch, "cells": len(ran), "not as documented": len(bad),
                     "where": "; ".join(f"{s} w{w}" for s, w in zip(bad["scenario"], bad["world_size"]))})
    return pd.DataFrame(rows, columns=["device", "torch", "cells", "not as documented", "where"])


def verdict_counts(cells: pd.DataFrame) -> list[tuple[str, int]]:
    counts = cells["verdict"].value_counts()
    return [(v, int(counts[v])) for v in VERDICTS if v in counts]


# --------------------------------------------------------------------------- all of it


@dataclass(kw_only=True)
class ReportTables:
    """Everything the renderers need."""

    cells: pd.DataFrame
    patches: pd.DataFrame
    deployed: pd.DataFrame
    environment: pd.DataFrame
    modules: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    n_records: int = 0
    generated_at: str = ""
    ledgers: dict[CellKey, Summary] = field(default_factory=dict)
    #: records of cells run with a fault injected: scenario x fault (``harness.results.sensitivity``)
    blind_spots: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: public stacks: function x torch -> status, the cells behind each, notes (``harness.results.stacks``)
    stacks: pd.DataFrame = field(default_factory=pd.DataFrame)
    stack_details: pd.DataFrame = field(default_factory=pd.DataFrame)
    stack_notes: list[str] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        return device_order(self.cells["device"])

    @property
    def ledger_changes(self) -> list[str]:
        return version_changes(self.ledgers)

    def versions(self, device: str) -> list[str]:
        return sorted_torch(self.cells.loc[self.cells["device"] == device, "torch"])


def build_tables(paths: Sequence[str | Path]) -> ReportTables:
    """Load and judge; ``RecordError`` when no valid record is found."""
    found, skipped = load_records(paths)
    faulted = [r for r, _ in found if r.fault is not None]  # sensitivity runs: not verdicts
    found = [(r, source) for r, source in found if r.fault is None]
    if not found:
        extra = f" ({len(skipped)} malformed lines skipped)" if skipped else ""
        raise RecordError(f"no valid records found in {', '.join(map(str, paths))}{extra}")
    latest = latest_records(records_frame(found))
    frame = _verdict_frame(latest)
    cells = frame.drop(columns="_contrib")
    modules = sorted({module_label(r.patches_module_id or r.patches_module) for r in latest["record"]
                      if r.variant != "vanilla"})
    return ReportTables(
        cells=cells, patches=patch_summary(frame), deployed=deployed_summary(cells),
        environment=environment_table(latest), modules=modules, skipped=skipped, sources=[str(p) for p in paths],
        n_records=len(found), generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        ledgers=ledger_summaries(latest["record"]), blind_spots=blind_spots(faulted))
