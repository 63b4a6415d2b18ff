"""Compatibility report: records (.jsonl) -> verdict tables -> Markdown, HTML, CSV.

Pipeline: ``load_records`` (validate, name skipped lines) -> ``latest_records``
(one record per cell and variant, the latest ``started_at`` wins) ->
``verdict_table`` (long form, one row per scenario/world size/torch/device of
the grid, "not run" where records are missing) -> ``patch_summary`` and
``environment_table`` -> ``render_markdown`` / ``render_html`` / CSV.

The grid for a device is every (scenario, world size) seen anywhere in the
records x every torch version seen on that device; cells with no record are
"not run".  Torch columns are sorted by version number (``packaging``).

Usage: ``python -m harness.report --records runs/ more.jsonl --out reports``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from packaging.version import InvalidVersion, Version

from harness.verdict import (
    NOT_RUN,
    PS_NOT_RUN,
    STATUSES,
    VERDICT_RULES,
    VERDICTS,
    combine_patch_statuses,
    judge,
    patch_contributions,
)

__all__ = [
    "CELL_KEY",
    "LONG_COLUMNS",
    "ReportInputError",
    "ReportTables",
    "build_report",
    "build_tables",
    "device_order",
    "environment_table",
    "expand_paths",
    "latest_records",
    "load_records",
    "main",
    "patch_summary",
    "pivot_table",
    "render_html",
    "render_markdown",
    "torch_sort_key",
    "validate_record",
    "verdict_table",
]

CELL_KEY: tuple[str, ...] = ("scenario", "torch", "device", "world_size")
VARIANTS: tuple[str, ...] = ("vanilla", "patched")
SCHEMA_VERSION = 1
INSTALL_STATUSES = frozenset({"installed", "already-installed", "not-applicable", "error"})

_NUM = (int, float)
REQUIRED_FIELDS: Mapping[str, tuple[type, ...]] = {
    "schema": (int,),
    "run_id": (str,),
    "started_at": (str,),
    "scenario": (str,),
    "variant": (str,),
    "patches": (list,),
    "torch": (str,),
    "device": (str,),
    "world_size": (int,),
    "status": (str,),
    "expected": (str,),
    "as_expected": (bool,),
}
OPTIONAL_FIELDS: Mapping[str, tuple[type, ...]] = {
    "patches_module": (str,),
    "patch_install": (dict,),
    "torch_git": (str,),
    "backend": (str,),
    "mesh": (list,),
    "expected_match": (str,),
    "exc_type": (str,),
    "exc_msg": (str,),
    "failing_rank": (int,),
    "traceback": (str,),
    "max_abs_diff": _NUM,
    "max_rel_diff": _NUM,
    "worst": (str,),
    "diffs": (list,),
    "grad_norm": _NUM,
    "ref_grad_norm": _NUM,
    "duration_s": _NUM,
    "reason": (str,),
    "env": (dict,),
}
ENV_FIELDS: tuple[str, ...] = ("python", "torch", "torch_build", "cuda", "gpu", "host", "platform", "cpus")
RECORD_COLUMNS: tuple[str, ...] = (
    *REQUIRED_FIELDS,
    *OPTIONAL_FIELDS,
    *(f"env_{name}" for name in ENV_FIELDS),
    "source",
    "record",
)
LONG_COLUMNS: tuple[str, ...] = (
    "device",
    "scenario",
    "world_size",
    "torch",
    "patches",
    "vanilla",
    "patched",
    "verdict",
    "unexpected",
    "vanilla_exc",
    "patched_exc",
    "vanilla_max_abs_diff",
    "patched_max_abs_diff",
    "vanilla_max_rel_diff",
    "patched_max_rel_diff",
    "worst",
    "vanilla_expected",
    "patched_expected",
    "backend",
    "torch_build",
    "rule",
)
OUTPUT_NAMES: Mapping[str, str] = {"md": "compat.md", "html": "compat.html", "csv": "compat.csv"}
MISSING_MARK = "—"
FLAG_MARK = "⚠"


class ReportInputError(Exception):
    """Input that cannot produce a report (no records, unreadable path)."""


# --------------------------------------------------------------------------- loading


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _field_problem(obj: Mapping[str, Any], name: str, types: tuple[type, ...], *, required: bool) -> str | None:
    if name not in obj:
        return f"missing key {name!r}" if required else None
    value = obj[name]
    if value is None and not required:
        return None
    if not _type_ok(value, types):
        want = "/".join(t.__name__ for t in types)
        return f"key {name!r} should be {want}, got {type(value).__name__}"
    return None


def _value_problem(obj: Mapping[str, Any]) -> str | None:
    if obj["schema"] != SCHEMA_VERSION:
        return f"unsupported schema {obj['schema']!r}"
    if obj["variant"] not in VARIANTS:
        return f"unknown variant {obj['variant']!r}"
    if obj["status"] not in STATUSES:
        return f"unknown status {obj['status']!r}"
    if not all(isinstance(p, str) for p in obj["patches"]):
        return "key 'patches' should be a list of str"
    for name, entry in (obj.get("patch_install") or {}).items():
        if not isinstance(entry, dict) or entry.get("status") not in INSTALL_STATUSES:
            return f"bad patch_install entry for {name!r}"
    return None


def validate_record(obj: Any) -> str | None:
    """Why ``obj`` is not a usable record, or None when it is."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for fields, required in ((REQUIRED_FIELDS, True), (OPTIONAL_FIELDS, False)):
        for name, types in fields.items():
            if (problem := _field_problem(obj, name, types, required=required)) is not None:
                return problem
    return _value_problem(obj)


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
            raise ReportInputError(f"no such file or folder: {path}")
    return files


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"bad JSON ({exc.msg} at column {exc.colno})"
    problem = validate_record(obj)
    return (None, problem) if problem else (obj, None)


def _flatten(obj: Mapping[str, Any], source: str) -> dict[str, Any]:
    row = {name: obj.get(name) for name in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)}
    env = obj.get("env") or {}
    row |= {f"env_{name}": env.get(name) for name in ENV_FIELDS}
    return row | {"source": source, "record": dict(obj)}


def _read_lines(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().splitlines()
    except OSError as exc:
        raise ReportInputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def load_records(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, list[str]]:
    """Valid records as a DataFrame (one row each) and the skipped lines as "file:lineno: reason"."""
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for path in expand_paths(paths):
        for lineno, raw in enumerate(_read_lines(path), start=1):
            if not raw.strip():
                continue
            obj, problem = _parse_line(raw)
            if obj is None:
                skipped.append(f"{path}:{lineno}: {problem}")
            else:
                rows.append(_flatten(obj, f"{path}:{lineno}"))
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS)), skipped


def latest_records(records: pd.DataFrame) -> pd.DataFrame:
    """One record per cell and variant: the latest ``started_at`` (then the later line) wins."""
    when = pd.to_datetime(records["started_at"], utc=True, errors="coerce", format="ISO8601")
    ordered = records.assign(_when=when, _order=range(len(records)))
    ordered = ordered.sort_values(["_when", "_order"], kind="stable", na_position="first")
    latest = ordered.drop_duplicates([*CELL_KEY, "variant"], keep="last")
    return latest.drop(columns=["_when", "_order"]).reset_index(drop=True)


# --------------------------------------------------------------------------- ordering


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


# --------------------------------------------------------------------------- verdict table


def _first_line(text: Any, limit: int = 200) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _exc_text(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return ""
    msg = _first_line(record.get("exc_msg"))
    exc_type = record.get("exc_type")
    if exc_type and msg:
        return f"{exc_type}: {msg}"
    return exc_type or msg or _first_line(record.get("reason"))


def _scenario_patches(records: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    out: dict[str, set[str]] = {}
    for scenario, patches in zip(records["scenario"], records["patches"]):
        out.setdefault(scenario, set()).update(patches)
    return {name: tuple(sorted(found)) for name, found in out.items()}


def _grid(records: pd.DataFrame) -> list[tuple[str, str, str, int]]:
    """(device, scenario, torch, world_size) for every cell of every device's pivot."""
    rows = sorted(set(zip(records["scenario"], records["world_size"])))
    cells = []
    for device in device_order(records["device"]):
        versions = sorted_torch(records.loc[records["device"] == device, "torch"])
        cells += [(device, scenario, torch, ws) for scenario, ws in rows for torch in versions]
    return cells


def _pick(record: Mapping[str, Any] | None, name: str) -> Any:
    return None if record is None else record.get(name)


def _cell_row(
    key: tuple[str, str, str, int],
    patches: tuple[str, ...],
    vanilla: Mapping[str, Any] | None,
    patched: Mapping[str, Any] | None,
) -> dict[str, Any]:
    device, scenario, torch, ws = key
    cell = judge(vanilla, patched, patches=patches)
    either = patched if patched is not None else vanilla
    env = _pick(either, "env") or {}
    return {
        "device": device,
        "scenario": scenario,
        "world_size": ws,
        "torch": torch,
        "patches": ";".join(patches),
        "vanilla": _pick(vanilla, "status") or "",
        "patched": _pick(patched, "status") or "",
        "verdict": cell.verdict,
        "unexpected": "; ".join(cell.unexpected),
        "vanilla_exc": _exc_text(vanilla),
        "patched_exc": _exc_text(patched),
        "vanilla_max_abs_diff": _pick(vanilla, "max_abs_diff"),
        "patched_max_abs_diff": _pick(patched, "max_abs_diff"),
        "vanilla_max_rel_diff": _pick(vanilla, "max_rel_diff"),
        "patched_max_rel_diff": _pick(patched, "max_rel_diff"),
        "worst": _pick(patched, "worst") or _pick(vanilla, "worst") or "",
        "vanilla_expected": _pick(vanilla, "expected") or "",
        "patched_expected": _pick(patched, "expected") or "",
        "backend": _pick(either, "backend") or "",
        "torch_build": env.get("torch_build") or "",
        "rule": cell.rule.number,
        "_contrib": patch_contributions(patches, cell, patched),
    }


def _by_cell(latest: pd.DataFrame) -> dict[tuple[str, str, str, int, str], dict[str, Any]]:
    return {
        (r["device"], r["scenario"], r["torch"], r["world_size"], r["variant"]): r["record"]
        for r in latest.to_dict("records")
    }


def _verdict_frame(latest: pd.DataFrame) -> pd.DataFrame:
    index = _by_cell(latest)
    patches = _scenario_patches(latest)
    rows = [
        _cell_row(key, patches[key[1]], index.get((*key, "vanilla")), index.get((*key, "patched")))
        for key in _grid(latest)
    ]
    return pd.DataFrame(rows, columns=[*LONG_COLUMNS, "_contrib"])


def verdict_table(records: pd.DataFrame) -> pd.DataFrame:
    """Long-form verdicts, one row per grid cell (records should be ``latest_records``)."""
    return _verdict_frame(records).drop(columns="_contrib")


def _contributions(cells: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {"patch": patch, "device": c["device"], "torch": c["torch"], "status": status,
         "source": f"{c['scenario']} ws={c['world_size']}: {c['verdict']}"}
        for c in cells.to_dict("records")
        for patch, status in c["_contrib"].items()
    ]
    return pd.DataFrame(rows, columns=["patch", "device", "torch", "status", "source"])


def patch_summary(cells_with_contrib: pd.DataFrame) -> pd.DataFrame:
    """patch x device x torch -> combined status and the scenario verdicts behind it."""
    contrib = _contributions(cells_with_contrib)
    grid = cells_with_contrib[["device", "torch"]].drop_duplicates()
    patches = sorted(set(contrib["patch"]))
    rows = []
    for patch in patches:
        for device, torch in grid.itertuples(index=False):
            mine = contrib[(contrib["patch"] == patch) & (contrib["device"] == device) & (contrib["torch"] == torch)]
            rows.append({
                "patch": patch, "device": device, "torch": torch,
                "status": combine_patch_statuses(mine["status"]) if len(mine) else PS_NOT_RUN,
                "detail": "; ".join(mine["source"]),
            })
    return pd.DataFrame(rows, columns=["patch", "device", "torch", "status", "detail"])


# --------------------------------------------------------------------------- environment


def _blank(value: Any) -> bool:
    return value is None or value == "" or _is_nan(value)


def _joined(values: Iterable[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if not _blank(v)}))


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _date_range(stamps: Iterable[str]) -> str:
    days = sorted({s[:10] for s in stamps if isinstance(s, str) and s})
    if not days:
        return ""
    return days[0] if days[0] == days[-1] else f"{days[0]} – {days[-1]}"


ENV_LABELS: tuple[str, ...] = ("torch build", "python", "device name", "backend", "host", "machine", "date")


def _env_column(group: pd.DataFrame) -> dict[str, str]:
    devices = [dev if _blank(gpu) else gpu for gpu, dev in zip(group["env_gpu"], group["device"])]
    return {
        "torch build": _joined(group["env_torch_build"]),
        "python": _joined(group["env_python"]),
        "device name": _joined(devices),
        "backend": _joined(group["backend"]),
        "host": _joined(group["env_host"]),
        "machine": _joined(_machine(group)),
        "date": _date_range(group["started_at"]),
    }


def _machine(group: pd.DataFrame) -> list[str]:
    platform = group["env_platform"] if "env_platform" in group else [None] * len(group)
    cpus = group["env_cpus"] if "env_cpus" in group else [None] * len(group)
    return [
        " ".join(part for part in (None if _blank(p) else str(p), None if _blank(c) else f"{int(c)} CPUs") if part)
        for p, c in zip(platform, cpus)
    ]


def environment_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Rows: device, torch, then one column per environment item."""
    rows = [
        {"device": device, "torch": torch, **_env_column(group)}
        for (device, torch), group in latest.groupby(["device", "torch"], sort=False)
    ]
    return pd.DataFrame(rows, columns=["device", "torch", *ENV_LABELS])


# --------------------------------------------------------------------------- tables


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

    def torch_versions(self, device: str) -> list[str]:
        return sorted_torch(self.cells.loc[self.cells["device"] == device, "torch"])


def build_tables(paths: Sequence[str | Path]) -> ReportTables:
    """Load and judge; raises ReportInputError when no valid record is found."""
    records, skipped = load_records(paths)
    if records.empty:
        extra = f" ({len(skipped)} malformed lines skipped)" if skipped else ""
        raise ReportInputError(f"no valid records found in {', '.join(map(str, paths))}{extra}")
    latest = latest_records(records)
    frame = _verdict_frame(latest)
    return ReportTables(
        cells=frame.drop(columns="_contrib"),
        patches=patch_summary(frame),
        environment=environment_table(latest),
        skipped=skipped,
        sources=[str(p) for p in paths],
        n_records=len(records),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


def _status_pair(row: Mapping[str, Any]) -> str:
    return f"{row['vanilla'] or MISSING_MARK} / {row['patched'] or MISSING_MARK}"


def cell_text(row: Mapping[str, Any]) -> str:
    """Pivot cell: "verdict (vanilla / patched)", plus ⚠ when something was unexpected."""
    both_missing = not row["vanilla"] and not row["patched"]
    text = row["verdict"] if both_missing else f"{row['verdict']} ({_status_pair(row)})"
    return f"{text} {FLAG_MARK}" if row["unexpected"] else text


def pivot_table(cells: pd.DataFrame, device: str) -> pd.DataFrame:
    """(scenario, world size) x torch version -> cell text, for one device."""
    mine = cells[cells["device"] == device]
    texts = mine.assign(cell=[cell_text(r) for r in mine.to_dict("records")])
    pivot = texts.pivot(index=["scenario", "world_size"], columns="torch", values="cell")
    return pivot.reindex(columns=sorted_torch(pivot.columns)).sort_index()


def _fmt_num(value: Any) -> str:
    if value is None or _is_nan(value) or value == "":
        return ""
    return f"{value:.3g}"


def _diff_text(row: Mapping[str, Any]) -> str:
    parts = [_fmt_num(row["vanilla_max_abs_diff"]), _fmt_num(row["patched_max_abs_diff"])]
    return "" if not any(parts) else f"{parts[0] or MISSING_MARK} / {parts[1] or MISSING_MARK}"


DETAIL_HEADERS: tuple[str, ...] = (
    "device", "scenario", "world size", "torch", "vanilla", "patched", "verdict",
    "unexpected", "vanilla error / note", "patched error / note", "max abs diff (v / p)", "worst",
)


def detail_rows(cells: pd.DataFrame) -> list[list[str]]:
    """Detail table rows for every cell with at least one record."""
    ran = cells[(cells["vanilla"] != "") | (cells["patched"] != "")]
    return [
        [r["device"], r["scenario"], str(r["world_size"]), r["torch"], r["vanilla"] or MISSING_MARK,
         r["patched"] or MISSING_MARK, r["verdict"], r["unexpected"], r["vanilla_exc"], r["patched_exc"],
         _diff_text(r), r["worst"]]
        for r in ran.to_dict("records")
    ]


def env_rows(environment: pd.DataFrame, device: str, versions: Sequence[str]) -> list[tuple[str, list[str]]]:
    """("torch build", [per torch column...]), ... for the pivot's footer."""
    mine = environment[environment["device"] == device].set_index("torch")
    labels = [c for c in environment.columns if c not in ("device", "torch")]
    return [(label, [str(mine.at[v, label]) if v in mine.index else "" for v in versions]) for label in labels]


def patch_pivot(patches: pd.DataFrame, device: str) -> pd.DataFrame:
    mine = patches[patches["device"] == device]
    if mine.empty:
        return pd.DataFrame()
    pivot = mine.pivot(index="patch", columns="torch", values="status")
    return pivot.reindex(columns=sorted_torch(pivot.columns)).sort_index()


def verdict_counts(cells: pd.DataFrame) -> list[tuple[str, int]]:
    counts = cells["verdict"].value_counts()
    return [(v, int(counts[v])) for v in VERDICTS if v in counts]


# --------------------------------------------------------------------------- markdown


def _md_escape(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_md_escape(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _md_pivot(tables: ReportTables, device: str) -> list[str]:
    pivot = pivot_table(tables.cells, device)
    versions = list(pivot.columns)
    rows = [[scenario, ws, *values] for (scenario, ws), values in zip(pivot.index, pivot.to_numpy().tolist())]
    rows += [[f"*env: {label}*", "", *values] for label, values in env_rows(tables.environment, device, versions)]
    return [f"## Verdicts: {device}", "", *_md_table(["scenario", "world size", *versions], rows)]


def _md_patches(tables: ReportTables, device: str) -> list[str]:
    pivot = patch_pivot(tables.patches, device)
    if pivot.empty:
        return [f"## Per-patch summary: {device}", "", "No scenario lists a patch.", ""]
    rows = [[patch, *values] for patch, values in zip(pivot.index, pivot.to_numpy().tolist())]
    return [f"## Per-patch summary: {device}", "", *_md_table(["patch", *pivot.columns], rows)]


def _summary_line(tables: ReportTables) -> str:
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(tables.cells))
    return (
        f"{tables.n_records} records, {len(tables.cells)} cells ({counts}); "
        f"{len(tables.skipped)} skipped input lines. Generated {tables.generated_at} "
        f"from {', '.join(tables.sources)}."
    )


LEGEND = (
    "Cell: verdict (vanilla status / patched status); "
    f"{MISSING_MARK} = no record; {FLAG_MARK} = a result differs from its documented expectation "
    "(see Details). Per-patch: broken > needed > retire > not applicable > not run."
)


def _md_rules() -> list[str]:
    rows = [[r.number, r.kind, r.vanilla, r.patched, r.verdict, r.meaning] for r in VERDICT_RULES]
    return ["## Verdict rules (first match wins)", "",
            *_md_table(["#", "kind", "vanilla", "patched", "verdict", "meaning"], rows)]


def render_markdown(tables: ReportTables) -> str:
    lines = ["# FSDP2 patch compatibility report", "", _summary_line(tables), "", LEGEND, ""]
    for device in tables.devices:
        lines += _md_pivot(tables, device) + _md_patches(tables, device)
    lines += ["## Details", "", *_md_table(DETAIL_HEADERS, detail_rows(tables.cells))]
    lines += ["## Skipped input lines", ""]
    lines += [f"- `{line}`" for line in tables.skipped] or ["None."]
    lines += ["", *_md_rules()]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- HTML

VERDICT_COLORS: Mapping[str, str] = {
    "ok": "#c8e6c9",
    "fixed upstream": "#a5d6a7",
    "expected failure": "#dcedc8",
    "patch needed": "#ffcc80",
    "patch broken": "#ef9a9a",
    "regression": "#ce93d8",
    "n/a": "#e0e0e0",
    "not run": "#f5f5f5",
}
PATCH_STATUS_COLORS: Mapping[str, str] = {
    "broken": VERDICT_COLORS["patch broken"],
    "needed": VERDICT_COLORS["patch needed"],
    "retire": VERDICT_COLORS["fixed upstream"],
    "not applicable": VERDICT_COLORS["n/a"],
    "not run": VERDICT_COLORS["not run"],
}

BASE_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #212121; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #9e9e9e; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #eceff1; }
td.cell { min-width: 130px; }
td.cell b { display: block; }
td.cell small { color: #424242; }
.flag { color: #b71c1c; font-weight: bold; }
tfoot td, tfoot th { background: #fafafa; font-size: 12px; color: #424242; }
td.not-run { color: #757575; font-style: italic; }
.legend span { display: inline-block; padding: 2px 8px; margin: 2px; border: 1px solid #9e9e9e; }
table.details td { font-size: 12px; max-width: 420px; }
"""


def _css_class(name: str) -> str:
    return name.replace(" ", "-").replace("/", "")


def _css() -> str:
    verdicts = "\n".join(f".v-{_css_class(v)} {{ background: {c}; }}" for v, c in VERDICT_COLORS.items())
    patches = "\n".join(f".p-{_css_class(s)} {{ background: {c}; }}" for s, c in PATCH_STATUS_COLORS.items())
    return BASE_CSS + verdicts + "\n" + patches + "\n"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _title(lines: Iterable[str]) -> str:
    return "&#10;".join(_e(line) for line in lines if line)


def cell_title(row: Mapping[str, Any]) -> list[str]:
    """Hover text for a pivot cell: errors, diffs, unexpected notes."""
    lines = [f"{row['scenario']} ws={row['world_size']} torch {row['torch']} ({row['device']})",
             f"verdict: {row['verdict']} (rule {row['rule']})"]
    for variant in ("vanilla", "patched"):
        status = row[variant] or "not run"
        exc = row[f"{variant}_exc"]
        diff = _fmt_num(row[f"{variant}_max_abs_diff"])
        lines.append(f"{variant}: {status}" + (f" — {exc}" if exc else "") + (f"; max abs diff {diff}" if diff else ""))
    if row["worst"]:
        lines.append(f"worst: {row['worst']}")
    return lines + [f"{FLAG_MARK} {note}" for note in row["unexpected"].split("; ") if note]


def _html_cell(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return '<td class="cell v-not-run not-run">not run</td>'
    klass = f"cell v-{_css_class(row['verdict'])}" + (" not-run" if row["verdict"] == NOT_RUN else "")
    flag = f' <span class="flag">{FLAG_MARK}</span>' if row["unexpected"] else ""
    pair = "" if not (row["vanilla"] or row["patched"]) else (
        f"<small>vanilla {_e(row['vanilla'] or MISSING_MARK)} · patched {_e(row['patched'] or MISSING_MARK)}</small>"
    )
    return f'<td class="{klass}" title="{_title(cell_title(row))}"><b>{_e(row["verdict"])}{flag}</b>{pair}</td>'


def _html_pivot(tables: ReportTables, device: str) -> str:
    mine = tables.cells[tables.cells["device"] == device]
    versions = tables.torch_versions(device)
    by_key = {(r["scenario"], r["world_size"], r["torch"]): r for r in mine.to_dict("records")}
    rows = sorted({(s, ws) for s, ws, _ in by_key})
    head = "".join(f"<th>{_e(v)}</th>" for v in versions)
    body = "".join(
        f"<tr><th>{_e(s)}</th><td>{ws}</td>" + "".join(_html_cell(by_key.get((s, ws, v))) for v in versions) + "</tr>"
        for s, ws in rows
    )
    foot = "".join(
        f'<tr><th colspan="2">{_e(label)}</th>' + "".join(f"<td>{_e(v)}</td>" for v in values) + "</tr>"
        for label, values in env_rows(tables.environment, device, versions)
    )
    return (f'<h2>Verdicts: {_e(device)}</h2><table class="pivot" id="pivot-{_e(device)}">'
            f"<thead><tr><th>scenario</th><th>world size</th>{head}</tr></thead>"
            f"<tbody>{body}</tbody><tfoot>{foot}</tfoot></table>")


def _html_patches(tables: ReportTables, device: str) -> str:
    mine = tables.patches[tables.patches["device"] == device]
    if mine.empty:
        return f"<h2>Per-patch summary: {_e(device)}</h2><p>No scenario lists a patch.</p>"
    versions = sorted_torch(mine["torch"])
    by_key = {(r["patch"], r["torch"]): r for r in mine.to_dict("records")}
    body = ""
    for patch in sorted(set(mine["patch"])):
        tds = "".join(
            f'<td class="p-{_css_class(r["status"])}" title="{_title(r["detail"].split("; "))}">{_e(r["status"])}</td>'
            for r in (by_key[(patch, v)] for v in versions)
        )
        body += f"<tr><th>{_e(patch)}</th>{tds}</tr>"
    head = "".join(f"<th>{_e(v)}</th>" for v in versions)
    return (f"<h2>Per-patch summary: {_e(device)}</h2><table class=\"patches\">"
            f"<thead><tr><th>patch</th>{head}</tr></thead><tbody>{body}</tbody></table>")


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], klass: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{klass}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _html_details(cells: pd.DataFrame) -> str:
    verdict_at = DETAIL_HEADERS.index("verdict")
    head = "".join(f"<th>{_e(h)}</th>" for h in DETAIL_HEADERS)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="v-{_css_class(c)}">{_e(c)}</td>' if i == verdict_at else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in detail_rows(cells)
    )
    return f'<h2>Details</h2><table class="details"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _html_legend() -> str:
    spans = "".join(f'<span class="v-{_css_class(v)}">{_e(v)}</span>' for v in VERDICTS)
    return f'<p class="legend">{spans}</p><p>{_e(LEGEND)}</p>'


def _html_skipped(skipped: Sequence[str]) -> str:
    if not skipped:
        return "<h2>Skipped input lines</h2><p>None.</p>"
    items = "".join(f"<li><code>{_e(line)}</code></li>" for line in skipped)
    return f'<h2>Skipped input lines</h2><ul class="skipped">{items}</ul>'


def render_html(tables: ReportTables) -> str:
    """Self-contained page: inline CSS, no scripts, no external assets."""
    sections = [f"<h1>FSDP2 patch compatibility report</h1><p>{_e(_summary_line(tables))}</p>", _html_legend()]
    for device in tables.devices:
        sections += [_html_pivot(tables, device), _html_patches(tables, device)]
    sections.append(_html_details(tables.cells))
    sections.append(_html_skipped(tables.skipped))
    rules = [[r.number, r.kind, r.vanilla, r.patched, r.verdict, r.meaning] for r in VERDICT_RULES]
    sections.append("<h2>Verdict rules (first match wins)</h2>"
                    + _html_table(["#", "kind", "vanilla", "patched", "verdict", "meaning"], rules, "rules"))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>FSDP2 patch compatibility report</title>"
            f"<style>{_css()}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")


# --------------------------------------------------------------------------- output


def write_outputs(tables: ReportTables, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in OUTPUT_NAMES.items()}
    paths["md"].write_text(render_markdown(tables), encoding="utf-8")
    paths["html"].write_text(render_html(tables), encoding="utf-8")
    tables.cells.to_csv(paths["csv"], index=False, columns=list(LONG_COLUMNS))
    return paths


def build_report(paths: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Write compat.md, compat.html and compat.csv; returns {"md"|"html"|"csv": path}."""
    return write_outputs(build_tables(paths), out_dir)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("--records", nargs="+", action="extend", metavar="PATH",
                        help=".jsonl files or folders of them (default: runs)")
    parser.add_argument("--out", default="reports", metavar="DIR", help="output folder (default: reports)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        tables = build_tables(args.records or ["runs"])
        written = write_outputs(tables, args.out)
    except (ReportInputError, OSError) as exc:
        print(f"harness.report: error: {exc}", file=sys.stderr)
        return 2
    if tables.skipped:
        print(f"harness.report: warning: skipped {len(tables.skipped)} malformed lines (listed in the report)",
              file=sys.stderr)
    for path in written.values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
