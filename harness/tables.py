"""Records -> the report's tables (pandas), each built once.

``records_frame`` (one row per record) -> ``latest_records`` (one per cell and variant,
the latest ``started_at`` wins) -> ``verdict_table`` (one row per scenario/world
size/torch/device of the grid, "not run" where records are missing) ->
``patch_summary``, ``environment_table`` and the pivots the renderers show.

The grid for a device is every (scenario, world size) seen anywhere in the records x
every torch version seen on that device. Torch columns sort by version number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from packaging.version import InvalidVersion, Version

from harness.names import PS_NOT_RUN, VERDICTS
from harness.record import Record, RecordError, load_records
from harness.verdict import combine_patch_statuses, judge, patch_contributions

__all__ = [
    "CELL_KEY",
    "LONG_COLUMNS",
    "ReportTables",
    "build_tables",
    "device_order",
    "environment_table",
    "latest_records",
    "patch_pivot",
    "patch_summary",
    "records_frame",
    "sorted_torch",
    "torch_sort_key",
    "verdict_counts",
    "verdict_pivot",
    "verdict_table",
]

CELL_KEY: tuple[str, ...] = ("scenario", "torch", "device", "world_size")
ENV_FIELDS: tuple[str, ...] = ("python", "torch_build", "gpu", "host", "platform", "cpus")
LONG_COLUMNS: tuple[str, ...] = (
    "device", "scenario", "world_size", "torch", "patches", "vanilla", "patched", "verdict", "unexpected",
    "vanilla_exc", "patched_exc", "vanilla_max_abs_diff", "patched_max_abs_diff", "vanilla_max_rel_diff",
    "patched_max_rel_diff", "worst", "vanilla_expected", "patched_expected", "backend", "torch_build", "rule",
)
ENV_LABELS: tuple[str, ...] = ("torch build", "python", "device name", "backend", "host", "machine", "date")


def records_frame(found: Sequence[tuple[Record, str]]) -> pd.DataFrame:
    """One row per record: its fields, ``env_*`` columns, ``source`` and the ``record`` itself."""
    names = [f.name for f in dataclasses.fields(Record)]
    rows = [{**{n: getattr(rec, n) for n in names}, **{f"env_{k}": rec.env.get(k) for k in ENV_FIELDS},
             "source": source, "record": rec} for rec, source in found]
    return pd.DataFrame(rows, columns=[*names, *(f"env_{k}" for k in ENV_FIELDS), "source", "record"])


def latest_records(records: pd.DataFrame) -> pd.DataFrame:
    """One record per cell and variant: the latest ``started_at`` (then the later line) wins."""
    when = pd.to_datetime(records["started_at"], utc=True, errors="coerce", format="ISO8601")
    ordered = records.assign(_when=when, _order=range(len(records)))
    ordered = ordered.sort_values(["_when", "_order"], kind="stable", na_position="first")
    latest = ordered.drop_duplicates([*CELL_KEY, "variant"], keep="last")
    return latest.drop(columns=["_when", "_order"]).reset_index(drop=True)


def torch_sort_key(version: str) -> tuple[int, Any, str]:
    """Numeric version order; unparsable strings go last, alphabetically."""
    try:
        return (0, Version(version), version)
    except InvalidVersion:
        return (1, 0, version)


def sorted_torch(versions: Iterable[str]) -> list[str]:
    return sorted(set(versions), key=torch_sort_key)


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
    msg = _first_line(rec.exc_msg)
    if rec.exc_type and msg:
        return f"{rec.exc_type}: {msg}"
    return rec.exc_type or msg or _first_line(rec.reason)


def _cell_row(key: tuple[str, str, str, int], patches: tuple[str, ...], vanilla: Record | None,
              patched: Record | None) -> dict[str, Any]:
    device, scenario, torch, ws = key
    cell = judge(vanilla, patched, patches=patches)
    either = patched or vanilla

    def pick(rec: Record | None, name: str) -> Any:
        return None if rec is None else getattr(rec, name)

    return {
        "device": device, "scenario": scenario, "world_size": ws, "torch": torch, "patches": ";".join(patches),
        "vanilla": pick(vanilla, "status") or "", "patched": pick(patched, "status") or "",
        "verdict": cell.verdict, "unexpected": "; ".join(cell.unexpected),
        "vanilla_exc": _exc_text(vanilla), "patched_exc": _exc_text(patched),
        "vanilla_max_abs_diff": pick(vanilla, "max_abs_diff"), "patched_max_abs_diff": pick(patched, "max_abs_diff"),
        "vanilla_max_rel_diff": pick(vanilla, "max_rel_diff"), "patched_max_rel_diff": pick(patched, "max_rel_diff"),
        "worst": pick(patched, "worst") or pick(vanilla, "worst") or "",
        "vanilla_expected": "|".join(pick(vanilla, "expected") or ()),
        "patched_expected": "|".join(pick(patched, "expected") or ()),
        "backend": pick(either, "backend") or "", "torch_build": (either.env if either else {}).get("torch_build") or "",
        "rule": cell.rule.number, "_contrib": patch_contributions(patches, cell, patched),
    }


def _grid(latest: pd.DataFrame) -> list[tuple[str, str, str, int]]:
    """(device, scenario, torch, world_size) for every cell of every device's pivot."""
    rows = sorted(set(zip(latest["scenario"], latest["world_size"])))
    cells = []
    for device in device_order(latest["device"]):
        versions = sorted_torch(latest.loc[latest["device"] == device, "torch"])
        cells += [(device, scenario, torch, ws) for scenario, ws in rows for torch in versions]
    return cells


def _verdict_frame(latest: pd.DataFrame) -> pd.DataFrame:
    index = {(r.device, r.scenario, r.torch, r.world_size, r.variant): r for r in latest["record"]}
    patches: dict[str, set[str]] = {}
    for r in latest["record"]:
        patches.setdefault(r.scenario, set()).update(r.patches)
    rows = [_cell_row(key, tuple(sorted(patches[key[1]])), index.get((*key, "vanilla")), index.get((*key, "patched")))
            for key in _grid(latest)]
    return pd.DataFrame(rows, columns=[*LONG_COLUMNS, "_contrib"])


def verdict_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Long-form verdicts, one row per grid cell (records should be ``latest_records``)."""
    return _verdict_frame(latest).drop(columns="_contrib")


def patch_summary(cells_with_contrib: pd.DataFrame) -> pd.DataFrame:
    """patch x device x torch -> combined status and the scenario verdicts behind it."""
    contrib = pd.DataFrame(
        [{"patch": patch, "device": c["device"], "torch": c["torch"], "status": status,
          "source": f"{c['scenario']} ws={c['world_size']}: {c['verdict']}"}
         for c in cells_with_contrib.to_dict("records") for patch, status in c["_contrib"].items()],
        columns=["patch", "device", "torch", "status", "source"])
    rows = []
    grid = cells_with_contrib[["device", "torch"]].drop_duplicates()
    for patch in sorted(set(contrib["patch"])):
        for device, torch in grid.itertuples(index=False):
            mine = contrib[(contrib["patch"] == patch) & (contrib["device"] == device) & (contrib["torch"] == torch)]
            rows.append({"patch": patch, "device": device, "torch": torch,
                         "status": combine_patch_statuses(mine["status"]) if len(mine) else PS_NOT_RUN,
                         "detail": "; ".join(mine["source"])})
    return pd.DataFrame(rows, columns=["patch", "device", "torch", "status", "detail"])


def verdict_pivot(cells: pd.DataFrame, device: str, values: str = "verdict") -> pd.DataFrame:
    """(scenario, world size) x torch version -> ``values``, for one device."""
    mine = cells[cells["device"] == device]
    pivot = mine.pivot(index=["scenario", "world_size"], columns="torch", values=values)
    return pivot.reindex(columns=sorted_torch(pivot.columns)).sort_index()


def patch_pivot(patches: pd.DataFrame, device: str, values: str = "status") -> pd.DataFrame:
    """patch x torch version -> ``values``, for one device (empty when no scenario lists a patch)."""
    mine = patches[patches["device"] == device]
    if mine.empty:
        return pd.DataFrame()
    pivot = mine.pivot(index="patch", columns="torch", values=values)
    return pivot.reindex(columns=sorted_torch(pivot.columns)).sort_index()


def verdict_counts(cells: pd.DataFrame) -> list[tuple[str, int]]:
    counts = cells["verdict"].value_counts()
    return [(v, int(counts[v])) for v in VERDICTS if v in counts]


# --------------------------------------------------------------------------- environment


def _joined(values: Iterable[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v is not None and v == v and v != ""}))


def _date_range(stamps: Iterable[str]) -> str:
    days = sorted({s[:10] for s in stamps if isinstance(s, str) and s})
    return "" if not days else days[0] if days[0] == days[-1] else f"{days[0]} – {days[-1]}"


def environment_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Rows: device, torch, then one column per environment item."""
    rows = []
    for (device, torch), g in latest.groupby(["device", "torch"], sort=False):
        machines = [" ".join(str(x) for x in (p, f"{int(c)} CPUs" if c == c and c is not None else None) if x)
                    for p, c in zip(g["env_platform"], g["env_cpus"])]
        rows.append({"device": device, "torch": torch, "torch build": _joined(g["env_torch_build"]),
                     "python": _joined(g["env_python"]),
                     "device name": _joined(gpu if gpu else dev for gpu, dev in zip(g["env_gpu"], g["device"])),
                     "backend": _joined(g["backend"]), "host": _joined(g["env_host"]), "machine": _joined(machines),
                     "date": _date_range(g["started_at"])})
    return pd.DataFrame(rows, columns=["device", "torch", *ENV_LABELS])


# --------------------------------------------------------------------------- all of it


@dataclass(kw_only=True)
class ReportTables:
    """Everything the renderers need."""

    cells: pd.DataFrame
    patches: pd.DataFrame
    environment: pd.DataFrame
    skipped: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    n_records: int = 0
    generated_at: str = ""

    @property
    def devices(self) -> list[str]:
        return device_order(self.cells["device"])


def build_tables(paths: Sequence[str | Path]) -> ReportTables:
    """Load and judge; ``RecordError`` when no valid record is found."""
    found, skipped = load_records(paths)
    if not found:
        extra = f" ({len(skipped)} malformed lines skipped)" if skipped else ""
        raise RecordError(f"no valid records found in {', '.join(map(str, paths))}{extra}")
    latest = latest_records(records_frame(found))
    frame = _verdict_frame(latest)
    return ReportTables(
        cells=frame.drop(columns="_contrib"), patches=patch_summary(frame), environment=environment_table(latest),
        skipped=skipped, sources=[str(p) for p in paths], n_records=len(found),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
