"""Render compat.html in headless Chromium: check the DOM text and the screenshot pixels."""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.report import VERDICT_COLORS, build_report

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1400, 900

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian package 'chromium' (/usr/bin/chromium missing)"),
]


def record(scenario: str, variant: str, torch: str, status: str, **extra: Any) -> dict[str, Any]:
    """A schema-1 record that met its expectation unless ``extra`` says otherwise."""
    base = {
        "schema": 1, "run_id": "r1", "started_at": "2026-11-20T10:00:00Z", "scenario": scenario,
        "variant": variant, "patches": ["unused_param_reduction"], "patch_install": {}, "torch": torch,
        "device": "cpu", "backend": "gloo", "world_size": 2, "mesh": [2], "status": status,
        "expected": status, "expected_match": None, "as_expected": True, "exc_type": None, "exc_msg": None,
        "max_abs_diff": None, "max_rel_diff": None, "worst": None, "diffs": [], "duration_s": 1.0,
        "env": {"python": "3.11.7", "torch": torch, "torch_build": "cpu", "cuda": None, "gpu": None,
                "host": "ci-host", "platform": "Linux"},
    }
    return base | extra


def sample_lines() -> list[str]:
    recs = [
        record("unused_params", "vanilla", "2.9.1", "error", exc_type="RuntimeError", exc_msg="reduction not finished"),
        record("unused_params", "patched", "2.9.1", "pass"),
        record("unused_params", "vanilla", "2.10.0", "error"),
        record("unused_params", "patched", "2.10.0", "pass"),
        record("unused_params", "vanilla", "2.13.0+cpu", "pass"),
        record("unused_params", "patched", "2.13.0+cpu", "pass"),
        record("baseline_mlp", "vanilla", "2.9.1", "pass", patches=[]),
        record("baseline_mlp", "patched", "2.9.1", "mismatch", patches=[], expected="pass", as_expected=False,
               max_abs_diff=0.5),
        record("baseline_mlp", "vanilla", "2.10.0", "pass", patches=[]),
    ]
    return [json.dumps(r) for r in recs] + ["{broken json"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    (root / "runs.jsonl").write_text("\n".join(sample_lines()) + "\n", encoding="utf-8")
    return build_report([root / "runs.jsonl"], root / "out")["html"]


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


def test_dom_shows_verdicts_and_versions(report: Path, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", report.as_uri()).stdout
    assert "FSDP2 patch compatibility report" in dom
    for text in ("patch needed", "patch broken", "fixed upstream", "not run", "ci-host", "unused_param_reduction"):
        assert text in dom, text
    header = dom[dom.index('id="verdicts-cpu"'):]
    positions = [header.index(f">{v}</th>") for v in ("2.9.1", "2.10.0", "2.13.0+cpu")]
    assert positions == sorted(positions), "torch columns not in numeric order"
    assert "runs.jsonl:10: bad JSON" in dom
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
    for verdict in ("patch needed", "patch broken", "fixed upstream"):
        assert counts[hex_rgb(VERDICT_COLORS[verdict])] > 1_000, f"no {verdict} cell visible"
