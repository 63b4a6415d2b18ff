"""The compatibility report, decision first: ``harness.results.tables`` rendered as Markdown
(``DataFrame.to_markdown``), HTML (pandas ``Styler`` in ``templates/report.html``) and CSV.

Order: what to do with each patch (per device: the lifecycle table, the deployed set,
the patch x torch statuses); the scenario x torch heatmap (short labels, the detail in
tooltips and in a linked details table); notes (reference adjustments, bugs that cannot
show on the device, upstream bugs); the environment; the details; the verdict rules.

Build it with ``python -m harness report --records runs/ --out reports``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.bugs import legend_rows
from harness.results.decisions import deployed_line, lane_notes, lifecycle, torch_columns, version_ranges
from harness.results.safe import content_security_policy, md_text, read_report_csv, safe_id, write_report_csv
from harness.results.sensitivity import blind_spot_lines
from harness.results.style import (
    ADJUSTED,
    BLIND_SPOTS,
    FLAG,
    LEGEND,
    OUTPUT_NAMES,
    PATCH_COLORS,
    SHORT,
    TITLE,
    VERDICT_COLORS,
    anchor,
    css,
)
from harness.results.tables import LONG_COLUMNS, ReportTables, build_tables, verdict_counts
from harness.results.verdict import rule_rows
from harness.vocabulary import VARIANTS, VERDICTS

__all__ = ["OUTPUT_NAMES", "SHORT", "VERDICT_COLORS", "build_report", "read_report_csv", "render_html",
           "render_markdown", "write_outputs"]

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


def _grid(tables: ReportTables, device: str, value) -> pd.DataFrame:
    mine = tables.cells[tables.cells["device"] == device]
    frame = mine.assign(_v=[value(r) for r in mine.to_dict("records")])
    pivot = frame.pivot(index=["scenario", "world_size"], columns="torch", values="_v")
    return torch_columns(pivot, tables.versions(device)).sort_index().rename_axis(["scenario", "w"]).fillna("")


def _patch_grid(tables: ReportTables, device: str, column: str) -> pd.DataFrame:
    mine = tables.patches[tables.patches["device"] == device]
    if mine.empty:
        return pd.DataFrame()
    return torch_columns(mine.pivot(index="patch", columns="torch", values=column), tables.versions(device))


def _details(cells: pd.DataFrame) -> pd.DataFrame:
    ran = cells[cells[list(VARIANTS)].ne("").any(axis=1)]
    cols = ["device", "scenario", "world_size", "torch", "verdict", *VARIANTS, "unexpected", "caveats",
            *(f"{v}_exc" for v in VARIANTS), "worst", "reference_adjusted"]
    return ran[cols].reset_index(drop=True)


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


def _environment(tables: ReportTables, device: str) -> pd.DataFrame:
    env = tables.environment[tables.environment["device"] == device].set_index("torch").drop(columns="device").T
    return torch_columns(env[env.ne("").any(axis=1)], tables.versions(device)).fillna("")  # rows with something


def _header(tables: ReportTables) -> list[str]:
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(tables.cells))
    machines = sorted({m for m in tables.environment["machine"] if m} | {h for h in tables.environment["host"] if h})
    return [f"Patches module under test: {'; '.join(tables.modules) or '(none: vanilla cells only)'}.",
            f"Machine: {', '.join(machines)}. Generated {tables.generated_at} from {', '.join(tables.sources)}: "
            f"{tables.n_records} records, {len(tables.cells)} cells ({counts}); {len(tables.skipped)} skipped input lines."]


# --------------------------------------------------------------------------- Markdown


def _md(frame: pd.DataFrame, *, index: bool = False) -> str:
    """Every cell and head through ``md_text``: record text shows as text."""
    shown = frame.map(md_text, cell=True).rename(columns=lambda c: md_text(c, cell=True))
    return shown.to_markdown(index=index, tablefmt="pipe", disable_numparse=True) + "\n"


#: cells the Markdown details leave out (every cell is in the CSV and the HTML report)
_ROUTINE = {"ok", "n/a"}
_MD_TEXT = 120


def _details_md(cells: pd.DataFrame) -> list[str]:
    """The details worth reading in Markdown: cells that are not routine, with the first
    failure's text shortened (every cell, texts in full, is in the CSV and the HTML)."""
    details = _details(cells)
    shown = details[~details["verdict"].isin(_ROUTINE) | details["unexpected"].ne("") | details["caveats"].ne("")]
    first_failure = [next((f"{v}: {_short(r[f'{v}_exc'])}" for v in VARIANTS if r[f"{v}_exc"]), "")
                     for r in shown.to_dict("records")]
    shown = shown.assign(caveats=shown["caveats"].map(_short), failure=first_failure)
    shown = shown[["device", "scenario", "world_size", "torch", "verdict", *VARIANTS, "unexpected", "caveats",
                   "failure", "worst"]]
    return [f"{len(shown)} of {len(details)} cells: those whose verdict is not {' or '.join(sorted(_ROUTINE))}, "
            f"or that have a caveat or an unexpected record (every cell, texts in full: compat.csv, compat.html).",
            "", _md(shown)]


def _short(text: str) -> str:
    return text if len(text) <= _MD_TEXT else text[:_MD_TEXT - 1] + "…"


def render_markdown(tables: ReportTables) -> str:
    out = [f"# {TITLE}", "", *map(md_text, _header(tables)), ""]
    for device in tables.devices:
        versions = tables.versions(device)
        life = lifecycle(tables.patches, device, versions)
        out += [f"## What to do with each patch: {md_text(device)}", "",
                _md(life) if len(life) else "No scenario names a patch.\n",
                md_text(deployed_line(tables.deployed, device, versions)), ""]
        grid = _patch_grid(tables, device, "status")
        if not grid.empty:
            out += [_md(grid.reset_index())]
    for device in tables.devices:
        shown = md_text(device)
        out += [f"## Scenario × torch: {shown}", "", LEGEND, "", _md(_grid(tables, device, _label).reset_index())]
        out += [f"### Notes: {shown}", "", *([f"- {md_text(n)}" for n in _notes(tables, device)] or ["None."]), ""]
        out += [f"### Environment: {shown}", "", _md(_environment(tables, device).rename_axis("").reset_index())]
    out += ["## Collective changes between torch versions", "", *(f"- {md_text(n)}" for n in tables.ledger_changes or ["None."]), ""]
    if not tables.blind_spots.empty:
        out += [f"## {BLIND_SPOTS}", "", _md(tables.blind_spots), *map(md_text, blind_spot_lines(tables.blind_spots)), ""]
    out += ["## Bug legend", "", _md(pd.DataFrame(legend_rows(tables.cells["scenario"])))]
    out += ["## Details", "", *_details_md(tables.cells), "## Skipped input lines", ""]
    out += [f"- {md_text(line)}" for line in tables.skipped] or ["None."]
    out += ["", "## Verdict rules (first match wins)", "", _md(pd.DataFrame(rule_rows()))]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- HTML


@dataclass(kw_only=True)
class _Section:
    title: str
    anchor: str
    html: str
    notes: list[str] = field(default_factory=list)


def _styled(frame: pd.DataFrame, *, table_class: str, classes: pd.DataFrame | None = None,
            titles: pd.DataFrame | None = None, escape: bool = True, index: bool = True) -> str:
    """Heads are always escaped, cells unless ``escape=False`` (already HTML), hover titles
    always (Styler writes them into the attribute as given)."""
    frame = frame.rename_axis(columns=None)
    styler = frame.style.format(escape="html" if escape else None)
    styler = styler.format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    if not index:
        styler = styler.hide(axis="index")
    if classes is not None:
        styler = styler.set_td_classes(classes)
    if titles is not None:
        styler = styler.set_tooltips(titles.map(lambda t: html.escape(str(t), quote=True)), as_title_attribute=True)
    return _EMPTY_STYLE.sub("", styler.to_html(table_attributes=f'class="{table_class}"'), count=1)


_EMPTY_STYLE = re.compile(r'\A<style type="text/css">\s*</style>\s*')  # Styler's; the page's CSP allows its own only


def _heatmap(tables: ReportTables, device: str) -> str:
    links = _grid(tables, device, lambda r: f'<a href="#{html.escape(anchor(r))}">{html.escape(_label(r))}</a>')
    classes = _grid(tables, device, lambda r: css("v", r["verdict"]))
    return _styled(links, table_class="heatmap", classes=classes, titles=_grid(tables, device, _title), escape=False)


def _details_html(cells: pd.DataFrame) -> str:
    details = _details(cells)
    shown = details.assign(scenario=[f'<span id="{html.escape(anchor(r))}">{html.escape(r["scenario"])}</span>'
                                     for r in details.to_dict("records")])
    for col in shown.columns.drop("scenario"):
        shown[col] = [html.escape(str(v)) for v in shown[col]]
    classes = details.map(lambda _: "").assign(verdict=[css("v", v) for v in details["verdict"]])
    return _styled(shown, table_class="details", classes=classes, escape=False, index=False)


def render_html(tables: ReportTables) -> str:
    """A self-contained page: inline CSS, no scripts, no external assets; its
    Content-Security-Policy allows that stylesheet (by hash) and nothing else."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    sections = []
    for device in tables.devices:
        versions = tables.versions(device)
        life = lifecycle(tables.patches, device, versions)
        grid = _patch_grid(tables, device, "status")
        body = _styled(life, table_class="lifecycle", index=False) if len(life) else "<p>No scenario names a patch.</p>"
        body += f'<p class="deployed">{html.escape(deployed_line(tables.deployed, device, versions))}</p>'
        if not grid.empty:
            body += _styled(grid, table_class="patches", classes=grid.map(lambda s: css("p", s)),
                            titles=_patch_grid(tables, device, "detail").map(lambda d: d.replace("; ", "\n")))
        sections.append(_Section(title=f"What to do with each patch: {device}", anchor=safe_id(f"patches-{device}"), html=body))
    for device in tables.devices:
        sections.append(_Section(title=f"Scenario × torch: {device}", anchor=safe_id(f"verdicts-{device}"),
                                 html=f'<p class="legend">{html.escape(LEGEND)}</p>' + _heatmap(tables, device),
                                 notes=_notes(tables, device)))
        sections.append(_Section(title=f"Environment: {device}", anchor=safe_id(f"environment-{device}"),
                                 html=_styled(_environment(tables, device), table_class="environment")))
    sections.append(_Section(title="Collective changes between torch versions", anchor="ledger", html="", notes=tables.ledger_changes))
    if not tables.blind_spots.empty:
        sections.append(_Section(title=BLIND_SPOTS, anchor="blind-spots", notes=blind_spot_lines(tables.blind_spots),
                                 html=_styled(tables.blind_spots, table_class="blind-spots", index=False)))
    bugs = _styled(pd.DataFrame(legend_rows(tables.cells["scenario"])), table_class="bugs", index=False)
    sections.append(_Section(title="Bug legend", anchor="bugs", html=bugs))
    sections.append(_Section(title="Details", anchor="details", html=_details_html(tables.cells)))
    skipped = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in tables.skipped)
    sections.append(_Section(title="Skipped input lines", anchor="skipped",
                             html=f'<ul class="skipped">{skipped}</ul>' if skipped else "<p>None.</p>"))
    sections.append(_Section(title="Verdict rules (first match wins)", anchor="rules",
                             html=_styled(pd.DataFrame(rule_rows()), table_class="rules", index=False)))
    colors = [(css("v", v), c) for v, c in VERDICT_COLORS.items()] + [(css("p", s), c) for s, c in PATCH_COLORS.items()]
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape())
    style = env.get_template("report_style.html").render(colors=colors)
    return env.get_template("report.html").render(title=TITLE, header=_header(tables), sections=sections,
                                                  style=style, csp=content_security_policy(styles=[style]))


# --------------------------------------------------------------------------- files


def write_outputs(tables: ReportTables, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in OUTPUT_NAMES.items()}
    paths["md"].write_text(render_markdown(tables), encoding="utf-8")
    paths["html"].write_text(render_html(tables), encoding="utf-8")
    write_report_csv(tables.cells, paths["csv"], columns=LONG_COLUMNS)
    write_report_csv(tables.patches, paths["patches_csv"])
    return paths


def build_report(paths: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Write compat.md, compat.html and compat.csv; returns {"md"|"html"|"csv": path}."""
    return write_outputs(build_tables(paths), out_dir)


assert set(SHORT) == set(VERDICTS), "every verdict needs a heatmap label"
