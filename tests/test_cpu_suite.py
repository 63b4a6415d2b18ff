"""The whole CPU suite on the torch installed here (2.13 in CI): every scenario and variant
at every world size it supports, each cell as its scenario documents."""

import json
import re
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def test_every_cell_of_the_cpu_suite_is_as_documented(tmp_path):
    out = tmp_path / "suite.jsonl"
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=1200)
    planned = int(re.search(r"^(\d+) cells -> ", res.stdout, re.M).group(1))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    unexpected = [f"{r['scenario']}[{r['variant']},w{r['world_size']}] {r['status']}: {r['exc_msg'] or r['worst']}"
                  for r in records if not r["as_expected"]]
    assert unexpected == []
    assert len(records) == planned > 100
    assert {r["variant"] for r in records} == {"vanilla", "patched", "deployed", "api"}
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
