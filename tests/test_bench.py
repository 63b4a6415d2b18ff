"""The launch benchmark runs and prints its figures; a hung cell costs at most its timeout + 2 s."""

import re
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def test_the_hung_cell_part_prints_its_figures_and_stays_within_timeout_plus_2_s():
    out = subprocess.run([sys.executable, "bench/launch_bench.py", "--parts", "f"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    m = re.search(r"the hung cell: hang after ([\d.]+) s \(timeout (\d+) s\)", out.stdout)
    assert m, out.stdout
    assert float(m.group(1)) <= float(m.group(2)) + 2
    # a difference of two walls measured one after the other: below zero when the first was slowed more
    assert re.search(r"extra wall for the hang\s+:\s+-?[\d.]+ s", out.stdout)


def test_unknown_parts_are_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "bench/launch_bench.py", "--parts", "ab,zz"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "unknown part(s): zz" in out.stderr
