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


def test_the_suite_with_the_hf_pack_refuses_to_run_where_transformers_is_missing():
    # transformers made unimportable: the hf_ cells would all be skipped, and (e) would time a smaller suite
    code = ("import runpy, sys; sys.modules['transformers'] = None; sys.argv = ['launch_bench.py', '--parts', 'e']; "
            "runpy.run_path('bench/launch_bench.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "transformers is not importable here" in out.stderr
    assert "suite with the HF pack" not in out.stdout  # refused before any suite ran


def test_the_suite_part_prints_the_bare_start_ratio_and_a_breakdown_that_adds_up():
    out = subprocess.run([sys.executable, "bench/launch_bench.py", "--parts", "e", "--scenario", "plain",
                          "--column", "no ledger:FSDP_COMPAT_LEDGER=0", "--column", "forked:--isolate fork"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    suite = float(re.search(r"^\(e\) suite of plain\s+:\s+([\d.]+) s", out.stdout, re.M).group(1))
    bare = float(re.search(r"^\(g\) bare 4-rank gloo start\s+:\s+([\d.]+) s", out.stdout, re.M).group(1))
    ratio = float(re.search(r"ratio \(e\)/\(g\)\s+:\s+([\d.]+)x", out.stdout).group(1))
    # (e) and (g) are printed to 0.1 s and the ratio to 0.01: the ratio of the printed figures may differ
    # from the printed ratio by what that rounding allows, and by no more
    rounding = 0.05 / bare + 0.05 * suite / (bare * (bare - 0.05)) + 0.005
    assert abs(ratio - suite / bare) <= rounding
    # one column per --column, each with its difference from (e)
    gains = re.findall(r"^\s+ratio \(e(\d)\)/\(g\)\s+:\s+([\d.]+)x\s+\(e\d\) - \(e\):\s+([-+][\d.]+) s\s+\[(.+)\]$",
                       out.stdout, re.M)
    assert [name for *_, name in gains] == ["no ledger", "forked"]
    for _, r, diff, _ in gains:
        # the same rounding: r to 0.01, (g), (e) and the difference to 0.1 s
        assert abs(float(r) * bare - suite - float(diff)) <= 0.005 * bare + 0.05 * float(r) + 0.05 + 0.05 + 1e-9
    table = out.stdout.split("breakdown:", 1)[1].splitlines()[4:]
    rows = {}
    for line in table:
        if "|" not in line:
            break
        name, cells = line.split("|", 1)
        rows[name.strip()] = [float(x) for x in cells.replace("|", " ").split()]
    assert {"startup", "training", "reference", "watchdog", "total"} <= set(rows)
    body = [v for k, v in rows.items() if k != "total"]
    assert len(rows["total"]) == 2 * (1 + 2)  # wall and CPU per column
    assert rows["total"] == pytest.approx([sum(v[j] for v in body) for j in range(len(rows["total"]))], abs=0.05)
    phased, wall = map(float, re.search(r"their phases add up to ([\d.]+) s of their ([\d.]+) s wall",
                                        out.stdout).groups())
    assert wall > 0 and phased == pytest.approx(wall, rel=0.05, abs=0.05)
    # the harness's own share: the first column's rank CPU less the cells' FSDP2 work and the reference
    cpu = {k: v[1] for k, v in rows.items()}
    m = re.search(r"^\[.+?\] the harness's own share of rank CPU: (\d+)% \(([\d.]+) of ([\d.]+) s", out.stdout, re.M)
    assert m, out.stdout
    share, own, total = int(m.group(1)), float(m.group(2)), float(m.group(3))
    assert total == pytest.approx(cpu["total"], abs=0.1)
    assert own == pytest.approx(total - sum(cpu.get(k, 0.0) for k in ("build + shard", "training", "reference")),
                                abs=0.2)
    assert 0 < own < total and abs(share - 100 * own / total) <= 1


MATRIX_LOG = """\
nox > /x/.nox/matrix-torch-2-8-0-device-cpu/bin/python -m harness run --hold --device cpu  (planned while the session before ran its cells)
[422/430, 8 left,   8.7s] c_vision_skipped_some_ranks[deployed,cpu,w2]         hang      1.35s  no result (a deadlock)
[426/430, 4 left,  10.7s] c_vision_skipped_some_ranks[patched,cpu,w2]          hang      3.34s  no result (a deadlock)
c_vision_skipped_some_ranks    deployed cpu     2  hang     hang             yes no result (a deadlock)
430 cells: crash 11, hang 2, pass 270; 0 not as expected (417 reused: inputs unchanged since an as-expected record; --fresh runs them)
nox > Session matrix(torch='2.8.0', device='cpu') was successful in 5 seconds.
"""


def test_the_matrix_rerun_bench_reads_sessions_adoptions_reuse_and_hang_cells_from_noxs_log():
    from bench.matrix_rerun import summary

    assert summary(MATRIX_LOG) == {"sessions": [("2.8.0", "5 seconds")], "adopted": 1, "reused": 417,
                                   "hangs": [1.35, 3.34]}


def test_the_matrix_rerun_bench_needs_the_other_sides_records():
    out = subprocess.run([sys.executable, "bench/matrix_rerun.py", "--records", "runs", "--against", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--against needs --against-records" in out.stderr
