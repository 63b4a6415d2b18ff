"""The report's model (``Section``, built by ``harness.results.report.sections``) and its two
renderings: Markdown (``DataFrame.to_markdown``, every record text shown as text) and a
self-contained HTML page (pandas ``Styler`` in ``templates/report.html``: inline CSS, no
scripts, no external assets)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.results.safe import content_security_policy, md_text
from harness.results.style import PATCH_COLORS, TITLE, VERDICT_COLORS, css

__all__ = ["Section", "html_page", "markdown"]


@dataclass(kw_only=True)
class Section:
    """One part of the report, as every format shows it."""

    title: str
    #: the HTML id of its heading (links and tests find sections by it)
    anchor: str
    #: 2: a part of the report; 3: a part of the section before it
    level: int = 2
    #: sentences before the table (the heatmap's legend)
    intro: list[str] = field(default_factory=list)
    #: the table, as text; None: none
    table: pd.DataFrame | None = None
    #: whether the table's index is part of it (the grids' scenario and world size)
    index: bool = False
    #: sentences after the table, shown as a list
    notes: list[str] = field(default_factory=list)
    #: said where there is neither a table nor a note
    empty: str = "None."
    #: HTML only: the table's class, and per cell a CSS class, a hover title, a link target
    table_class: str = ""
    classes: pd.DataFrame | None = None
    titles: pd.DataFrame | None = None
    links: pd.DataFrame | None = None
    #: HTML only: each row's id (the details rows the heatmap links to), by a column's cells
    row_ids: tuple[str, list[str]] | None = None
    #: Markdown only: the rows it shows (the table's columns or fewer), and a sentence saying which
    markdown_rows: pd.DataFrame | None = None
    markdown_intro: str = ""


# --------------------------------------------------------------------------- Markdown


def _md(frame: pd.DataFrame, *, index: bool = False) -> str:
    """Every cell and head through ``md_text``: record text shows as text."""
    if index:
        frame = frame.rename_axis([n or "" for n in frame.index.names]).reset_index()
    shown = frame.map(md_text, cell=True).rename(columns=lambda c: md_text(c, cell=True))
    return shown.to_markdown(index=False, tablefmt="pipe", disable_numparse=True) + "\n"


def markdown(header: list[str], parts: list[Section]) -> str:
    out = [f"# {TITLE}", "", *map(md_text, header), ""]
    for s in parts:
        out += [f"{'#' * s.level} {md_text(s.title)}", ""]
        out += [line for text in s.intro for line in (md_text(text), "")]
        if s.markdown_rows is not None:
            out += [md_text(s.markdown_intro), "", _md(s.markdown_rows)]
        elif s.table is not None:
            out += [_md(s.table.rename_axis(columns=None), index=s.index)]
        out += [f"- {md_text(n)}" for n in s.notes]
        if s.table is None and not s.notes:
            out += [md_text(s.empty)]
        out += [""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- HTML


def _styled(s: Section) -> str:
    """The section's table: heads always escaped, cells escaped (and wrapped in their links
    or row ids), hover titles escaped for the attribute Styler writes them into."""
    frame = s.table.rename_axis(columns=None)
    shown = frame.map(lambda v: html.escape(str(v)))
    if s.links is not None:
        targets = s.links.reindex_like(frame).fillna("")
        shown = pd.DataFrame([[f'<a href="#{html.escape(t)}">{v}</a>' if t else v for v, t in zip(row, trow)]
                              for row, trow in zip(shown.values, targets.values)], index=frame.index, columns=frame.columns)
    if s.row_ids is not None:
        column, ids = s.row_ids
        shown[column] = [f'<span id="{html.escape(i)}">{v}</span>' for v, i in zip(shown[column], ids)]
    styler = shown.style.format(escape=None).set_uuid(s.anchor.replace("-", "_"))  # stable ids: a rebuilt page diffs by content
    styler = styler.format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    if not s.index:
        styler = styler.hide(axis="index")
    if s.classes is not None:
        styler = styler.set_td_classes(s.classes)
    if s.titles is not None:
        styler = styler.set_tooltips(s.titles.map(lambda t: html.escape(str(t), quote=True)), as_title_attribute=True)
    table_class = s.table_class or "plain"
    return _EMPTY_STYLE.sub("", styler.to_html(table_attributes=f'class="{table_class}"'), count=1)


_EMPTY_STYLE = re.compile(r'\A<style type="text/css">\s*</style>\s*')  # Styler's; the page's CSP allows its own only


def _body(s: Section) -> str:
    body = "".join(f'<p class="intro">{html.escape(text)}</p>' for text in s.intro)
    if s.table is not None:
        body += _styled(s)
    elif not s.notes:
        body += f"<p>{html.escape(s.empty)}</p>"
    return body


def html_page(header: list[str], parts: list[Section]) -> str:
    """A self-contained page; its Content-Security-Policy allows its stylesheet (by hash) and
    nothing else."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    shown = [dict(title=s.title, anchor=s.anchor, level=s.level, html=_body(s), notes=s.notes) for s in parts]
    colors = [(css("v", v), c) for v, c in VERDICT_COLORS.items()] + [(css("p", s), c) for s, c in PATCH_COLORS.items()]
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape())
    style = env.get_template("report_style.html").render(colors=colors)
    return env.get_template("report.html").render(title=TITLE, header=header, sections=shown, style=style,
                                                  csp=content_security_policy(styles=[style]))
