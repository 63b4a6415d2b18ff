"""The compatibility report, decision first: one model (``Section``s built once from
``harness.results.tables``), rendered as Markdown and HTML (``harness.results.render``), and
the tables as CSV.

Order: what to do with each patch (per device: the lifecycle table with the deployed set,
then the patch x torch statuses); the scenario x torch heatmap (short labels, the detail in
tooltips and in a linked details table) with its notes (reference adjustments, bugs that
cannot show on the device, upstream bugs); the environment; collective changes; blind
spots; the bug legend; the details; skipped input lines; the verdict rules.

A section says what it says once: its table holds the text every format shows; HTML adds
colours, hover titles and links from the same rows; Markdown shows a section's
``markdown_rows`` where it is long (the details: the cells worth reading).

Build it with ``python -m harness report --records runs/ --out reports``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from harness.bugs import legend_rows
from harness.results.decisions import deployed_line, lane_notes, lifecycle, torch_columns, version_ranges
from harness.results.render import Section, html_page, markdown
from harness.results.safe import read_report_csv, safe_id, write_report_csv
from harness.results.sensitivity import blind_spot_lines
from harness.results.stacks import stack_rows, status_class
from harness.results.style import (
    ADJUSTED,
    BLIND_SPOTS,
    FLAG,
    LEGEND,
    OUTPUT_NAMES,
    PATCH_COLORS,
    SHORT,
    VERDICT_COLORS,
    anchor,
    css,
)
from harness.results.tables import LONG_COLUMNS, ReportTables, build_tables, verdict_counts
from harness.results.verdict import rule_rows
from harness.undertest.stacks import STACKS_DIR, load_stacks
from harness.vocabulary import VARIANTS, VERDICTS

__all__ = ["OUTPUT_NAMES", "SHORT", "VERDICT_COLORS", "PATCH_COLORS", "Section", "build_report", "header",
           "read_report_csv", "render_html", "render_markdown", "sections", "write_outputs"]


def header(tables: ReportTables) -> list[str]:
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(tables.cells))
    machines = sorted({m for m in tables.environment["machine"] if m} | {h for h in tables.environment["host"] if h})
    return [f"Patches module under test: {'; '.join(tables.modules) or '(none: vanilla cells only)'}.",
            f"Machine: {', '.join(machines)}. Generated {tables.generated_at} from {', '.join(tables.sources)}: "
            f"{tables.n_records} records, {len(tables.cells)} cells ({counts}); {len(tables.skipped)} skipped input lines."]


def sections(tables: ReportTables) -> list[Section]:
    """The report's parts, in order."""
    out = [s for device in tables.devices for s in _patch_sections(tables, device)]
    if not tables.stacks.empty:
        out.append(_stacks(tables))
    for device in tables.devices:
        out += [_heatmap(tables, device), _environment(tables, device)]
    out.append(Section(title="Collective changes between torch versions", anchor="ledger", notes=tables.ledger_changes))
    if not tables.blind_spots.empty:
        out.append(Section(title=BLIND_SPOTS, anchor="blind-spots", table=tables.blind_spots, table_class="blind-spots",
                           notes=blind_spot_lines(tables.blind_spots)))
    out.append(Section(title="Bug legend", anchor="bugs", table=pd.DataFrame(legend_rows(tables.cells["scenario"])),
                       table_class="bugs"))
    out.append(_details(tables.cells))
    out.append(Section(title="Skipped input lines", anchor="skipped", notes=list(tables.skipped)))
    out.append(Section(title="Verdict rules (first match wins)", anchor="rules", table=pd.DataFrame(rule_rows()),
                       table_class="rules"))
    return out


# --------------------------------------------------------------------------- the sections


def _patch_sections(tables: ReportTables, device: str) -> list[Section]:
    versions = tables.versions(device)
    life = lifecycle(tables.patches, device, versions)
    out = [Section(title=f"What to do with each patch: {device}", anchor=safe_id(f"patches-{device}"),
                   table=life if len(life) else None, table_class="lifecycle",
                   notes=[deployed_line(tables.deployed, device, versions)], empty="No scenario names a patch.")]
    grid = _patch_grid(tables, device, "status")
    if not grid.empty:
        out.append(Section(title=f"Patch × torch: {device}", anchor=safe_id(f"patch-grid-{device}"), level=3,
                           table=grid, index=True, table_class="patches", classes=grid.map(lambda s: css("p", s)),
                           titles=_patch_grid(tables, device, "detail").map(lambda d: d.replace("; ", "\n"))))
    return out


def _stacks(tables: ReportTables) -> Section:
    """Public stacks: each judged function's status per torch (CPU), the cells behind it on hover."""
    table, details = tables.stacks, tables.stack_details
    versions = [c for c in table.columns if c not in ("stack", "function", "bugs", "as patch")]
    classes = table.copy()
    classes.loc[:, :] = ""
    classes[versions] = table[versions].map(lambda s: css("p", status_class(s)))
    return Section(title="Public stacks: cpu", anchor="stacks", table=table, table_class="patches stacks",
                   intro=["Patch functions training stacks ship, judged as they ship them (the entries in stacks/, "
                          "run by python -m harness stacks run): what to do with each per torch version; hover for the "
                          "cells that decided it."],
                   notes=tables.stack_notes, classes=classes,
                   titles=details.map(lambda d: str(d).replace("; ", "\n")))


def _heatmap(tables: ReportTables, device: str) -> Section:
    grid = _grid(tables, device, _label)
    return Section(title=f"Scenario × torch: {device}", anchor=safe_id(f"verdicts-{device}"), intro=[LEGEND],
                   table=grid, index=True, table_class="heatmap", notes=_notes(tables, device),
                   classes=_grid(tables, device, lambda r: css("v", r["verdict"])),
                   titles=_grid(tables, device, _title), links=_grid(tables, device, anchor))


def _environment(tables: ReportTables, device: str) -> Section:
    env = tables.environment[tables.environment["device"] == device].set_index("torch").drop(columns="device").T
    env = torch_columns(env[env.ne("").any(axis=1)], tables.versions(device)).fillna("")  # rows with something
    return Section(title=f"Environment: {device}", anchor=safe_id(f"environment-{device}"), level=3, table=env,
                   index=True, table_class="environment")


#: cells the Markdown details leave out (every cell is in the CSV and the HTML report)
_ROUTINE = {"ok", "n/a"}
_MD_TEXT = 120


def _details(cells: pd.DataFrame) -> Section:
    """Every cell that ran; Markdown shows those worth reading (not routine, or with a caveat
    or an unexpected record), with the first failure's text shortened."""
    ran = cells[cells[list(VARIANTS)].ne("").any(axis=1)]
    cols = ["device", "scenario", "world_size", "torch", "verdict", *VARIANTS, "unexpected", "caveats",
            *(f"{v}_exc" for v in VARIANTS), "worst", "reference_adjusted"]
    details = ran[cols].reset_index(drop=True)
    shown = details[~details["verdict"].isin(_ROUTINE) | details["unexpected"].ne("") | details["caveats"].ne("")]
    first_failure = [next((f"{v}: {_short(r[f'{v}_exc'])}" for v in VARIANTS if r[f"{v}_exc"]), "")
                     for r in shown.to_dict("records")]
    shown = shown.assign(caveats=shown["caveats"].map(_short), failure=first_failure)
    shown = shown[["device", "scenario", "world_size", "torch", "verdict", *VARIANTS, "unexpected", "caveats",
                   "failure", "worst"]]
    return Section(title="Details", anchor="details", table=details, table_class="details",
                   classes=details.map(lambda _: "").assign(verdict=[css("v", v) for v in details["verdict"]]),
                   row_ids=("scenario", [anchor(r) for r in details.to_dict("records")]), markdown_rows=shown,
                   markdown_intro=f"{len(shown)} of {len(details)} cells: those whose verdict is not "
                                  f"{' or '.join(sorted(_ROUTINE))}, or that have a caveat or an unexpected record "
                                  "(every cell, texts in full: compat.csv, compat.html).")


def _short(text: str) -> str:
    return text if len(text) <= _MD_TEXT else text[:_MD_TEXT - 1] + "…"


def _label(row: Mapping) -> str:
    return SHORT[row["verdict"]][0] + (f" {FLAG}" if row["unexpected"] else "") + (
        f" {ADJUSTED}" if row["reference_adjusted"] else "")


def _num(value) -> str:
    return "" if value is None or value != value or value == "" else f"{value:.3g}"


def _title(row: Mapping) -> str:
    lines = [f"{row['scenario']} w{row['world_size']} torch {row['torch']} ({row['device']}): {row['verdict']}",
             f"rule {row['rule']}"]
    for v in VARIANTS:
        if row[v]:
            diff = _num(row[f"{v}_max_abs_diff"])
            lines.append(f"{v}: {row[v]}" + (f" — {row[f'{v}_exc']}" if row[f"{v}_exc"] else "")
                         + (f"; max abs diff {diff}" if diff else ""))
    extra = [row["worst"] and f"worst: {row['worst']}", row["reference_adjusted"] and f"{ADJUSTED} {row['reference_adjusted']}"]
    return "\n".join(lines + [e for e in extra if e] + [f"{FLAG} {n}" for n in row["unexpected"].split("; ") if n]
                     + [f"caveat: {c}" for c in row["caveats"].split("; ") if c])


def _grid(tables: ReportTables, device: str, value: Callable[[Mapping], str]) -> pd.DataFrame:
    mine = tables.cells[tables.cells["device"] == device]
    frame = mine.assign(_v=[value(r) for r in mine.to_dict("records")])
    pivot = frame.pivot(index=["scenario", "world_size"], columns="torch", values="_v")
    return torch_columns(pivot, tables.versions(device)).sort_index().rename_axis(["scenario", "w"]).fillna("")


def _patch_grid(tables: ReportTables, device: str, column: str) -> pd.DataFrame:
    mine = tables.patches[tables.patches["device"] == device]
    if mine.empty:
        return pd.DataFrame()
    return torch_columns(mine.pivot(index="patch", columns="torch", values=column), tables.versions(device))


def _notes(tables: ReportTables, device: str) -> list[str]:
    mine = tables.cells[tables.cells["device"] == device]
    versions = tables.versions(device)
    notes = lane_notes(tables.environment, device, versions)
    adjusted = mine[mine["reference_adjusted"] != ""]
    for quirk, g in adjusted.groupby("reference_adjusted"):
        notes.append(f"{ADJUSTED} Reference adjusted on {version_ranges(versions, set(g['torch']))} "
                     f"({len(g)} cells): {quirk}.")
    for scenario in sorted(set(mine.loc[~mine["bug_observable"].astype(bool), "scenario"])):
        notes.append(f"{scenario}: its bug cannot show on {device}; its cells check the numbers only.")
    for (scenario, issue), g in mine[mine["upstream"] != ""].groupby(["scenario", "upstream"]):
        shown = g[g["verdict"] == "upstream bug"]
        if len(shown):
            notes.append(f"Upstream bug {issue} shown by {scenario} on {version_ranges(versions, set(shown['torch']))}.")
    return notes


# --------------------------------------------------------------------------- files


def render_markdown(tables: ReportTables) -> str:
    return markdown(header(tables), sections(tables))


def render_html(tables: ReportTables) -> str:
    return html_page(header(tables), sections(tables))


def write_outputs(tables: ReportTables, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in OUTPUT_NAMES.items()}
    parts, lines = sections(tables), header(tables)
    paths["md"].write_text(markdown(lines, parts), encoding="utf-8")
    paths["html"].write_text(html_page(lines, parts), encoding="utf-8")
    write_report_csv(tables.cells, paths["csv"], columns=LONG_COLUMNS)
    write_report_csv(tables.patches, paths["patches_csv"])
    if tables.stacks.empty:
        del paths["stacks_csv"]
    else:
        write_report_csv(tables.stacks, paths["stacks_csv"])
    return paths


def build_report(paths: Sequence[str | Path], out_dir: str | Path, stacks: str | Path | None = None) -> dict[str, Path]:
    """Write compat.md, compat.html and compat.csv (and compat-stacks.csv with the records of
    ``harness stacks run`` in ``stacks``); returns {"md"|"html"|"csv"|...: path}."""
    return write_outputs(with_stacks(build_tables(paths), stacks), out_dir)


def with_stacks(tables: ReportTables, folder: str | Path | None) -> ReportTables:
    """``tables`` with the Public stacks section's rows, where ``folder`` holds stack records."""
    if folder is None or not Path(folder).is_dir():
        return tables
    tables.stacks, tables.stack_details, tables.stack_notes = stack_rows(Path(folder), load_stacks(STACKS_DIR),
                                                                         versions=tables.versions("cpu") or None)
    return tables


assert set(SHORT) == set(VERDICTS), "every verdict needs a heatmap label"
