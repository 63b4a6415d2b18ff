"""The pytest plugin: one item per cell, documented failures xfail(strict), XPASS fails,
JUnit from pytest, cells batched one launch per (device, world size) per worker."""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_cells_become_items_with_the_right_outcomes(tmp_path, workers):
    junit, out = tmp_path / "cells.xml", tmp_path / "r.jsonl"
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "--fsdp-compat",
                          "--fsdp-compat-scenarios-dir", "tests/fixtures/plugin_scenarios", "-k", "plug_",
                          "--fsdp-compat-variant", "vanilla", "--fsdp-compat-out", str(out),
                          "--fsdp-compat-shuffle", "7",  # every run option reaches the launch (harness.runconfig)
                          f"--junitxml={junit}", "-p", "no:cacheprovider", "-rA", *workers],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = res.stdout[-3000:]
    assert res.returncode == 1, tail  # the XPASS(strict) and the regression fail the run
    assert re.search(r"2 failed, 2 passed, (\d+ deselected, )?1 xfailed", tail), tail
    assert "plug_regression[vanilla,cpu,w2]" in tail and "error, expected pass: planted failure" in tail
    assert "[XPASS(strict)]" in tail and "plug_fixed_upstream[vanilla,cpu,w2]" in tail
    # under xdist a cell's (device, world size) group rides on its node id, as xdist's loadgroup writes it
    cases = {c.get("name").split("@")[0]: c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"plug_passes[vanilla,cpu,w1]", "plug_passes[vanilla,cpu,w2]",
                          "plug_documented[vanilla,cpu,w2]", "plug_fixed_upstream[vanilla,cpu,w2]",
                          "plug_regression[vanilla,cpu,w2]"}
    assert cases["plug_documented[vanilla,cpu,w2]"].find("skipped") is not None  # how JUnit shows an xfail
    assert cases["plug_regression[vanilla,cpu,w2]"].find("failure") is not None
    files = list(tmp_path.glob("r*.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len(records) == 5
    assert {r["order_seed"] for r in records} == {7}
    launches = {(r["launch_id"], r["world_size"]) for r in records}
    assert len({ws for _, ws in launches}) == len(launches)  # one launch per world size, cells batched in it


def test_entry_point_name_is_the_module_name():
    """Installed, the plugin loads from its pytest11 entry point; `-p harness.pytest_plugin` must then
    name the same plugin, or pytest stops with 'Plugin already registered under a different name'."""
    import tomllib
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert {name: mod for name, mod in eps.items() if mod == "harness.pytest_plugin"} == \
        {"harness.pytest_plugin": "harness.pytest_plugin"}
