"""Opening a report never runs what records carry: every string field of the records holds
script, attribute break-outs, Markdown markup and spreadsheet formulas; the HTML is
rendered in headless Chromium with and without its Content-Security-Policy (so the
escaping holds on its own), the Markdown and the CSV are checked as text."""

from __future__ import annotations

import csv
import html
import json
import re
import subprocess
from dataclasses import fields
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.results.diff import load_side
from harness.results.record import Record
from harness.results.report import build_report
from harness.results.safe import read_report_csv, write_report_csv
from harness.results.tables import LONG_COLUMNS

CHROMIUM = Path("/usr/bin/chromium")
TITLE = "FSDP2 patch compatibility report"
CSP_META = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>')


def hostile(tag: str) -> str:
    """A formula first (spreadsheets), then script, an attribute break-out, Markdown markup,
    and a line break with a heading after it; ``tag`` names the field it was put in."""
    return (f"=HYPERLINK(\"x\",\"{tag}\") <img src=x onerror=\"document.title='pwned-{tag}'\">"
            f"<script>document.title=\"pwned-{tag}\"</script>\" onmouseover=\"document.title='pwned-{tag}'\" x=\" "
            f"' autofocus onfocus='document.title=\"pwned-{tag}\"' | `tick` [link](javascript:void(0)) **b** "
            f"<!-- c -->\n# heading-{tag}\r\n@SUM(1)")


def short(tag: str) -> str:
    """For fields cut to their first line or to a few characters: the dangerous part first."""
    return f"<img src=x onerror=\"document.title='pwned-{tag}'\"><script>document.title='pwned-{tag}'</script>"


#: fields whose text a report shows; each must show up (escaped) in the page (text or hover titles)
SHOWN = ("scenario", "device", "torch", "backend", "patch", "install_reason", "exc_type", "exc_msg", "skip_reason",
         "worst", "quirk", "upstream", "env_python", "env_torch", "env_gpu", "env_host", "env_platform",
         "patches_module_id", "expected_match", "skipped_line", "source")
#: ... and in the CSV, which has a few more
CSV_SHOWN = ("api", "env_build", "scenario", "exc_msg", "patches_module_id", "install_reason")


def records() -> list[dict[str, Any]]:
    h = hostile
    patch = h("patch")
    env = {"python": h("env_python"), "torch": h("env_torch"), "torch_build": h("env_build"), "gpu": h("env_gpu"),
           "host": h("env_host"), "platform": h("env_platform"), "cpus": 2}
    base = {"schema": 2, "run_id": h("run_id"), "launch_id": h("launch_id"), "started_at": "2026-11-20T10:00:00Z",
            "scenario": h("scenario"), "device": h("device"), "backend": h("backend"), "world_size": 2,
            "torch": h("torch"), "torch_git": h("torch_git"), "patches_module": h("patches_module"),
            "patches_module_id": h("patches_module_id"), "patches": [patch], "installed_patches": [patch],
            "reference_quirks": [h("quirk")], "api": h("api"), "api_replaces": [patch], "env": env,
            "traceback": h("traceback"), "log": h("log"), "rank_errors": {h("rank_key"): h("rank_error")},
            "caveats": [h("caveats")], "diffs": [{"name": h("diff_name")}]}
    err = {"status": "error", "expected": "error", "as_expected": True, "exc_type": short("exc_type"),
           "exc_msg": short("exc_msg") + h("exc_msg")}
    return [
        base | err | {"variant": "vanilla", "fixed_by": patch},
        base | {"variant": "patched", "status": "mismatch", "expected": "pass", "as_expected": False,
                "max_abs_diff": 0.5, "worst": h("worst"),
                "patch_install": {patch: {"status": "error", "reason": h("install_reason")}}},
        base | {"variant": "deployed", "status": "pass", "expected": "pass", "as_expected": True},
        base | err | {"variant": "vanilla", "scenario": "plain", "torch": "2.13.0", "as_expected": False,
                      "expected_match": h("expected_match")},
        *(base | err | {"variant": v, "scenario": "upstream", "torch": "2.13.0", "patches": [], "upstream": h("upstream")}
          for v in ("vanilla", "deployed")),
        base | {"variant": "vanilla", "scenario": "skipped", "torch": "2.13.0", "status": "skip",
                "expected": "pass", "as_expected": True, "reason": short("skip_reason")},
    ]


def write_records(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (short("source").replace("/", "") + ".jsonl")
    bad = json.dumps(records()[0] | {"status": short("skipped_line")})
    path.write_text("\n".join([*map(json.dumps, records()), bad]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    return build_report([write_records(root / "runs")], root / "out")


# --------------------------------------------------------------------------- the page, as text


class _Dom(HTMLParser):
    """Elements, attributes and text of a page (what the browser built, from --dump-dom)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.text: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_title:
            self.title += data


def parse(page: str) -> _Dom:
    dom = _Dom()
    dom.feed(page)
    return dom


def assert_inert(dom: _Dom) -> None:
    assert dom.title == TITLE, f"a record's script ran: title {dom.title!r}"
    assert not {"img", "script", "iframe", "object", "embed"} & set(dom.tags), set(dom.tags)
    assert [a for a in dom.attrs if a[1].startswith("on") or a[1] in ("autofocus", "x")] == []
    assert all(v.startswith("#") for _, k, v in dom.attrs if k == "href"), "a link leaves the page"


def test_the_html_source_carries_no_live_markup_and_a_strict_csp(report: dict[str, Path]) -> None:
    page = report["html"].read_text(encoding="utf-8")
    (meta,) = CSP_META.findall(page)
    policy = html.unescape(meta.split('content="', 1)[1].split('"', 1)[0])
    assert "default-src 'none'" in policy and "script-src 'none'" in policy and "unsafe-inline" not in policy
    assert re.search(r"style-src 'sha256-[A-Za-z0-9+/=]{44}'", policy)
    assert_inert(parse(page))
    assert "document.title" in page  # the texts are there, as text
    dom = parse(page)
    text = "".join(dom.text) + "".join(v for _, _, v in dom.attrs)
    missing = [tag for tag in SHOWN if f"pwned-{tag}" not in text]
    assert missing == [], f"fields not shown in the page, so not tested: {missing}"
    if "caveats" in {f.name for f in fields(Record)}:
        assert "pwned-caveats" in text


# --------------------------------------------------------------------------- the page, in a browser


def dump_dom(tmp_path: Path, page: Path) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom"]
    out = subprocess.run([str(CHROMIUM), *flags, page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True)
    return out.stdout


@pytest.mark.parametrize("policy", ["with CSP", "CSP stripped"])
@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian package 'chromium' (/usr/bin/chromium)")
def test_nothing_runs_in_chromium(report: dict[str, Path], tmp_path: Path, policy: str) -> None:
    page = report["html"].read_text(encoding="utf-8")
    if policy == "CSP stripped":
        page = CSP_META.sub("", page)
    copy = tmp_path / "page.html"
    copy.write_text(page, encoding="utf-8")
    dom = parse(dump_dom(tmp_path, copy))
    assert_inert(dom)
    assert "pwned-exc_msg" in "".join(dom.text)  # the page was rendered, with the record text in it


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian package 'chromium' (/usr/bin/chromium)")
def test_the_csp_blocks_a_script_that_got_through(report: dict[str, Path], tmp_path: Path) -> None:
    """The probe can fail: a raw script slipped into the page runs without the CSP, not with it."""
    page = report["html"].read_text(encoding="utf-8").replace(
        "</body>", '<script>document.title="pwned-slipped"</script><img src=x onerror="document.title=1"></body>')
    titles = {}
    for name, text in (("with", page), ("without", CSP_META.sub("", page))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "page.html").write_text(text, encoding="utf-8")
        titles[name] = parse(dump_dom(tmp_path / name, tmp_path / name / "page.html")).title
    assert titles["with"] == TITLE and titles["without"] in ("pwned-slipped", "1"), titles


# --------------------------------------------------------------------------- Markdown and CSV


def test_markdown_has_no_raw_markup_and_intact_tables(report: dict[str, Path]) -> None:
    md = report["md"].read_text(encoding="utf-8")
    assert "<" not in md and ">" not in md.replace("&gt;", "")  # no raw HTML, no autolinks
    assert not re.search(r"(?<!\\)`", md), "an unescaped backtick"
    assert not re.search(r"(?<!\\)\[", md), "an unescaped link bracket"
    assert not re.search(r"^#+ heading-", md, flags=re.M), "a record's line break started a heading"
    assert "\r" not in md
    for table in re.findall(r"(?:^\|.*\n)+", md, flags=re.M):
        widths = {len(re.findall(r"(?<!\\)\|", row)) for row in table.splitlines()}
        assert len(widths) == 1, f"a record's pipe split a table row: {table[:300]}"
    assert "pwned-exc_type" in md and "pwned-scenario" in md


def test_csv_cells_cannot_start_a_formula_and_read_back_unchanged(report: dict[str, Path], tmp_path: Path) -> None:
    for kind in ("csv", "patches_csv"):
        with report[kind].open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        starts = [c for row in rows for c in row if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
        assert starts == [], starts[:3]
        assert any(c.startswith("'=HYPERLINK") for row in rows for c in row)
    back = read_report_csv(report["csv"])
    assert list(back.columns) == list(LONG_COLUMNS)
    assert hostile("scenario") in set(back["scenario"]) and hostile("install_reason") in "".join(back["unexpected"])
    missing = [tag for tag in CSV_SHOWN if not back.map(lambda v, t=tag: f"pwned-{t}" in str(v)).any().any()]
    assert missing == [], f"fields not in the CSV, so not tested: {missing}"
    side = load_side(report["csv"])  # `harness diff` reads the original texts
    assert hostile("scenario") in set(side.cells["scenario"]) and hostile("patch") in set(side.patches["patch"])


@pytest.mark.parametrize("text", ["=1+2", "+1", "-1", "@x", "\tx", "\rx", "'=x", "'", "''", "plain", "", "a=b",
                                  "-", "'plain"])
def test_csv_neutralising_is_lossless(tmp_path: Path, text: str) -> None:
    frame = pd.DataFrame({"a": [text], "n": [-1.5]})
    write_report_csv(frame, tmp_path / "x.csv")
    raw = (tmp_path / "x.csv").read_text(encoding="utf-8")
    assert "\n=" not in raw and ",=" not in raw and "\n@" not in raw
    back = read_report_csv(tmp_path / "x.csv")
    assert back["a"].tolist() == [text] and back["n"].tolist() == [-1.5]
