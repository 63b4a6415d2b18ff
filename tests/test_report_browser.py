"""Render compat.html in headless Chromium at 1400x900: the per-patch table is in the first
screen, the heatmap has one linked cell per (scenario, world size, torch), and the colours show."""

from __future__ import annotations

import html
import json
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.results.report import PATCH_COLORS, build_report
from harness.results.safe import content_security_policy

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1400, 900

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian package 'chromium' (/usr/bin/chromium missing)"),
]


VERSIONS = ["2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"]
SCENARIOS = [f"scenario_{i:02d}" for i in range(24)]


def record(scenario: str, variant: str, torch: str, status: str, world_size: int = 2, **extra: Any) -> dict[str, Any]:
    """A record that met its expectation unless ``extra`` says otherwise."""
    base = {
        "schema": 2, "run_id": "r1", "started_at": "2026-11-20T10:00:00Z", "scenario": scenario,
        "variant": variant, "patches": ["unused_param_reduction"], "torch": torch, "device": "cpu",
        "backend": "gloo", "world_size": world_size, "status": status, "expected": status, "as_expected": True,
        "patches_module_id": "fsdp_patches 1.0 (fsdp_patches, sha256 0123456789ab)",
        "env": {"python": "3.11.7", "torch": torch + "+cpu", "torch_build": "cpu", "host": "ci-host",
                "platform": "Linux-x86_64", "cpus": 2},
    }
    return base | extra


def sample_lines() -> list[str]:
    """A full-size matrix: 24 scenarios x 2 world sizes x 9 versions, needed on old versions,
    fixed upstream from 2.13, one broken patched cell, one malformed line."""
    recs = []
    for scenario in SCENARIOS:
        for ws in (2, 4):
            for i, v in enumerate(VERSIONS):
                vanilla = "pass" if i >= 6 else "error"
                recs.append(record(scenario, "vanilla", v, vanilla, ws, exc_type="RuntimeError",
                                   exc_msg="reduction not finished", fixed_by="unused_param_reduction"))
                recs.append(record(scenario, "patched", v, "pass", ws))
                recs.append(record(scenario, "deployed", v, "pass", ws))
    recs.append(record(SCENARIOS[0], "patched", "2.10.0", "mismatch", 2, expected="pass", as_expected=False,
                       max_abs_diff=0.5, started_at="2026-11-21T10:00:00Z"))
    return [json.dumps(r) for r in recs] + ["{broken json"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    (root / "runs.jsonl").write_text("\n".join(sample_lines()) + "\n", encoding="utf-8")
    return build_report([root / "runs.jsonl"], root / "out")["html"]


#: Appended to a copy of the page: measures the layout at the window size and writes it
#: into the DOM, which --dump-dom then prints (the report itself has no script; the copy's
#: Content-Security-Policy allows this one by its hash, as it would a script of the page).
PROBE = """<script>
const life = document.querySelector("table.lifecycle").getBoundingClientRect();
const cells = document.querySelectorAll("table.heatmap td");
document.body.insertAdjacentHTML("beforeend", "<pre id=probe>" + JSON.stringify({
  lifecycle_top: life.top, lifecycle_bottom: life.bottom, viewport: window.innerHeight,
  heatmap_cells: cells.length, linked: document.querySelectorAll("table.heatmap td a[href^='#d-']").length,
  targets: [...cells].filter(td => { const a = td.querySelector("a");
                                      return a && document.getElementById(a.getAttribute("href").slice(1)); }).length,
}) + "</pre>");
</script>"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=120, check=True)


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """(width, height, pixels) for an 8-bit, non-interlaced RGB/RGBA PNG, stdlib only."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, pixels = bytearray(stride), []
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [tuple(line[x:x + 3]) for x in range(0, stride, bpp)]
        prev = line
    return width, height, pixels


def hex_rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_first_screen_has_the_per_patch_table_and_the_heatmap_has_one_cell_per_run(report: Path,
                                                                                   tmp_path: Path) -> None:
    probed = tmp_path / "probed.html"
    page = report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>")
    probe_hash = content_security_policy(styles=[], scripts=[PROBE.removeprefix("<script>").removesuffix("</script>")])
    allowed = probe_hash.split("script-src ", 1)[1].split(";", 1)[0].replace("'", "&#39;")
    assert page.count("script-src &#39;none&#39;") == 1
    probed.write_text(page.replace("script-src &#39;none&#39;", f"script-src {allowed}"), encoding="utf-8")
    dom = chromium(tmp_path, f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", "--dump-dom",
                   probed.as_uri()).stdout
    probe = json.loads(html.unescape(dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]))
    # headless Chromium keeps some of the window for its (invisible) UI: the viewport is what counts
    assert 0.7 * HEIGHT < probe["viewport"] <= HEIGHT
    assert 0 < probe["lifecycle_top"] < probe["lifecycle_bottom"] <= probe["viewport"], probe  # in the first screen
    assert probe["heatmap_cells"] == len(SCENARIOS) * 2 * len(VERSIONS)  # (scenario, world size, torch)
    assert probe["linked"] == probe["targets"] == probe["heatmap_cells"]  # every cell links to its details row


def test_dom_shows_decisions_and_versions(report: Path, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", report.as_uri()).stdout
    assert "FSDP2 patch compatibility report" in dom
    assert "fsdp_patches 1.0 (sha256 0123456789ab)" in dom  # name, version, hash: no folder
    assert "2.7.1–2.9.1, 2.11.0–2.12.1" in dom and "2.13.0–2.15.0 (shown by scenario_00" in dom
    header = dom[dom.index('id="verdicts-cpu"'):]
    positions = [header.index(f">{v}</th>") for v in VERSIONS]
    assert positions == sorted(positions), "torch columns not in numeric order"
    assert "+cpu</th>" not in header.split("</thead>")[0]  # builds go in the environment rows
    assert "2.13.0+cpu" in dom[dom.index('id="environment-cpu"'):]
    assert "runs.jsonl:" in dom and "bad JSON" in dom
    assert "reduction not finished" in dom  # hover title / details


def test_screenshot_is_colored_by_verdict(report: Path, tmp_path: Path) -> None:
    png = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}", report.as_uri())
    data = png.read_bytes()
    assert len(data) > 20_000, f"screenshot suspiciously small: {len(data)} bytes"
    width, height, pixels = decode_png(data)
    assert (width, height) == (WIDTH, HEIGHT)
    counts = Counter(pixels)
    assert len(counts) > 50, "screenshot is (nearly) a single color"
    assert counts.most_common(1)[0][1] < 0.95 * len(pixels)
    for status in ("needed", "retire", "broken"):  # the per-patch statuses, in the first screen
        assert counts[hex_rgb(PATCH_COLORS[status])] > 500, f"no {status} cell visible"
