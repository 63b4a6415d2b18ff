"""The compatibility report: ``harness.tables`` rendered as Markdown (``DataFrame.to_markdown``),
HTML (pandas ``Styler`` in ``templates/report.html``) and CSV.

Build it with ``python -m harness report --records runs/ --out reports``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.names import VERDICTS
from harness.tables import LONG_COLUMNS, ReportTables, build_tables, patch_pivot, verdict_counts, verdict_pivot
from harness.verdict import VERDICT_RULES

__all__ = ["OUTPUT_NAMES", "VERDICT_COLORS", "build_report", "render_html", "render_markdown", "write_outputs"]

TITLE = "FSDP2 patch compatibility report"
OUTPUT_NAMES: Mapping[str, str] = {"md": "compat.md", "html": "compat.html", "csv": "compat.csv"}
MISSING_MARK = "—"
FLAG_MARK = "⚠"
VERDICT_COLORS: Mapping[str, str] = {
    "patch broken": "#ef9a9a", "regression": "#ce93d8", "patch needed": "#ffcc80", "fixed upstream": "#a5d6a7",
    "expected failure": "#dcedc8", "ok": "#c8e6c9", "n/a": "#e0e0e0", "not run": "#f5f5f5",
}
PATCH_STATUS_COLORS: Mapping[str, str] = {
    "broken": VERDICT_COLORS["patch broken"], "needed": VERDICT_COLORS["patch needed"],
    "retire": VERDICT_COLORS["fixed upstream"], "not applicable": VERDICT_COLORS["n/a"],
    "not run": VERDICT_COLORS["not run"],
}
LEGEND = (f"Cell: verdict (vanilla status / patched status); {MISSING_MARK} = no record; {FLAG_MARK} = a result "
          "differs from its documented expectation (see Details). Per-patch: broken > needed > retire > "
          "not applicable > not run.")
DETAIL_COLUMNS: Mapping[str, str] = {
    "device": "device", "scenario": "scenario", "world_size": "world size", "torch": "torch", "vanilla": "vanilla",
    "patched": "patched", "verdict": "verdict", "unexpected": "unexpected", "vanilla_exc": "vanilla error / note",
    "patched_exc": "patched error / note", "diff": "max abs diff (v / p)", "worst": "worst",
}


def css_class(prefix: str, name: str) -> str:
    return f"{prefix}-" + name.replace(" ", "-").replace("/", "")


# --------------------------------------------------------------------------- cell text


def _pair(row: Mapping[str, Any]) -> str:
    return f"{row['vanilla'] or MISSING_MARK} / {row['patched'] or MISSING_MARK}"


def cell_text(row: Mapping[str, Any]) -> str:
    """Pivot cell: "verdict (vanilla / patched)", plus ⚠ when something was unexpected."""
    text = row["verdict"] if not (row["vanilla"] or row["patched"]) else f"{row['verdict']} ({_pair(row)})"
    return f"{text} {FLAG_MARK}" if row["unexpected"] else text


def _num(value: Any) -> str:
    return "" if value is None or value != value or value == "" else f"{value:.3g}"


def cell_title(row: Mapping[str, Any]) -> str:
    """Hover text for a pivot cell: errors, diffs, unexpected notes."""
    lines = [f"{row['scenario']} ws={row['world_size']} torch {row['torch']} ({row['device']})",
             f"verdict: {row['verdict']} (rule {row['rule']})"]
    for variant in ("vanilla", "patched"):
        exc, diff = row[f"{variant}_exc"], _num(row[f"{variant}_max_abs_diff"])
        lines.append(f"{variant}: {row[variant] or 'not run'}" + (f" — {exc}" if exc else "")
                     + (f"; max abs diff {diff}" if diff else ""))
    if row["worst"]:
        lines.append(f"worst: {row['worst']}")
    return "\n".join(lines + [f"{FLAG_MARK} {note}" for note in row["unexpected"].split("; ") if note])


def _with_text(cells: pd.DataFrame) -> pd.DataFrame:
    rows = cells.to_dict("records")
    return cells.assign(text=[cell_text(r) for r in rows], title=[cell_title(r) for r in rows],
                        css=[css_class("v", r["verdict"]) for r in rows])


def _details(cells: pd.DataFrame) -> pd.DataFrame:
    ran = cells[(cells["vanilla"] != "") | (cells["patched"] != "")].copy()
    ran["diff"] = [f"{_num(v) or MISSING_MARK} / {_num(p) or MISSING_MARK}" if _num(v) or _num(p) else ""
                   for v, p in zip(ran["vanilla_max_abs_diff"], ran["patched_max_abs_diff"])]
    for variant in ("vanilla", "patched"):
        ran[variant] = ran[variant].replace("", MISSING_MARK)
    return ran[list(DETAIL_COLUMNS)].rename(columns=DETAIL_COLUMNS).reset_index(drop=True)


def _env_rows(tables: ReportTables, device: str, versions: Sequence[str]) -> pd.DataFrame:
    env = tables.environment[tables.environment["device"] == device].set_index("torch")
    labels = [c for c in env.columns if c != "device"]
    return pd.DataFrame([[env.at[v, label] if v in env.index else "" for v in versions] for label in labels],
                        index=pd.MultiIndex.from_tuples([(f"env: {label}", "") for label in labels]), columns=versions)


def _rules() -> pd.DataFrame:
    return pd.DataFrame([[r.number, r.kind, r.vanilla, r.patched, r.verdict, r.meaning] for r in VERDICT_RULES],
                        columns=["#", "kind", "vanilla", "patched", "verdict", "meaning"])


def _summary(tables: ReportTables) -> str:
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(tables.cells))
    return (f"{tables.n_records} records, {len(tables.cells)} cells ({counts}); {len(tables.skipped)} skipped input "
            f"lines. Generated {tables.generated_at} from {', '.join(tables.sources)}.")


# --------------------------------------------------------------------------- Markdown


def _md(frame: pd.DataFrame, *, index: bool = False) -> str:
    return frame.to_markdown(index=index, tablefmt="pipe", disable_numparse=True) + "\n"


def render_markdown(tables: ReportTables) -> str:
    cells = _with_text(tables.cells)
    out = [f"# {TITLE}", "", _summary(tables), "", LEGEND, ""]
    for device in tables.devices:
        pivot = verdict_pivot(cells, device, "text")
        env = _env_rows(tables, device, list(pivot.columns)).rename(index=lambda s: f"*{s}*" if s else s)
        grid = pd.concat([pivot, env]).rename_axis(["scenario", "world size"]).reset_index()
        out += [f"## Verdicts: {device}", "", _md(grid), f"## Per-patch summary: {device}", ""]
        patches = patch_pivot(tables.patches, device)
        out += [_md(patches.rename_axis("patch").reset_index()) if not patches.empty else "No scenario lists a patch.\n"]
    out += ["## Details", "", _md(_details(tables.cells)), "## Skipped input lines", ""]
    out += [f"- `{line}`" for line in tables.skipped] or ["None."]
    out += ["", "## Verdict rules (first match wins)", "", _md(_rules())]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- HTML


@dataclass(kw_only=True)
class _Section:
    title: str
    anchor: str
    html: str
    note: str = ""


def _styled(frame: pd.DataFrame, *, classes: pd.DataFrame | None = None, titles: pd.DataFrame | None = None,
            table_class: str) -> str:
    styler = frame.style
    if classes is not None:
        styler = styler.set_td_classes(classes)
    if titles is not None:
        styler = styler.set_tooltips(titles, as_title_attribute=True)
    return styler.to_html(table_attributes=f'class="{table_class}"')


def _html_pivot(cells: pd.DataFrame, tables: ReportTables, device: str) -> str:
    text, css, title = (verdict_pivot(cells, device, v) for v in ("text", "css", "title"))
    env = _env_rows(tables, device, list(text.columns))
    blank = pd.DataFrame("", index=env.index, columns=env.columns)
    return _styled(pd.concat([text, env]), classes=pd.concat([css, blank]), titles=pd.concat([title, blank]),
                   table_class="pivot")


def _html_patches(tables: ReportTables, device: str) -> str:
    status = patch_pivot(tables.patches, device)
    if status.empty:
        return "<p>No scenario lists a patch.</p>"
    detail = patch_pivot(tables.patches, device, "detail").map(lambda d: d.replace("; ", "\n"))
    return _styled(status, classes=status.map(lambda s: css_class("p", s)), titles=detail, table_class="patches")


def render_html(tables: ReportTables) -> str:
    """A self-contained page: inline CSS, no scripts, no external assets."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    cells = _with_text(tables.cells)
    sections = []
    for device in tables.devices:
        sections += [_Section(title=f"Verdicts: {device}", anchor=f"verdicts-{device}",
                              html=_html_pivot(cells, tables, device)),
                     _Section(title=f"Per-patch summary: {device}", anchor=f"patches-{device}",
                              html=_html_patches(tables, device))]
    details = _details(tables.cells)
    sections.append(_Section(title="Details", anchor="details", html=_styled(
        details, classes=details.map(lambda _: "").assign(verdict=[css_class("v", v) for v in details["verdict"]]),
        table_class="details")))
    skipped = "".join(f"<li><code>{line}</code></li>" for line in tables.skipped)
    sections.append(_Section(title="Skipped input lines", anchor="skipped",
                             html=f'<ul class="skipped">{skipped}</ul>' if skipped else "<p>None.</p>"))
    sections.append(_Section(title="Verdict rules (first match wins)", anchor="rules",
                             html=_styled(_rules(), table_class="rules")))
    colors = [(css_class("v", v), c) for v, c in VERDICT_COLORS.items()]
    colors += [(css_class("p", s), c) for s, c in PATCH_STATUS_COLORS.items()]
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape())
    return env.get_template("report.html").render(
        title=TITLE, summary=_summary(tables), legend=[(v, css_class("v", v)) for v in VERDICTS],
        legend_text=LEGEND, sections=sections, colors=colors)


# --------------------------------------------------------------------------- files


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

