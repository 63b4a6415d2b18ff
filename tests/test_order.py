"""Cells run many per process: no cell's outcome may depend on the cells before it. A
scenario that leaves process-wide state changed (``harness.rank.state``) gets a caveat and
the next cell starts clean; a run and its shuffled rerun (``run --shuffle``) agree."""

import json
import subprocess
import sys

import pytest

from harness.results.diff import diff_runs, load_side
from tests.support import ROOT

LEAKS = '''\
"""Builds its model in float64 and turns deterministic algorithms on, and leaves both so."""
import torch
from harness.spec import Scenario, Sharding
from scenarios._models import MLP


def model():
    torch.set_default_dtype(torch.float64)
    return MLP()


def batch(ctx):
    torch.use_deterministic_algorithms(True)
    return torch.randn(5, 7)


SCENARIO = Scenario(model=model, batch=batch, sharding=Sharding(units=("layers.0", "layers.1", "layers.2")),
                    world_sizes=(1, 2))
'''

PLAIN_FP32 = '''\
"""Plain float32 training that fails after a cell that left float64 or deterministic algorithms on."""
import torch
from harness.spec import Scenario, Sharding
from scenarios._models import MLP


def model():
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError("deterministic algorithms are on")
    return MLP()


SCENARIO = Scenario(model=model, batch=lambda ctx: torch.randn(5, 7, dtype=torch.float32), world_sizes=(1, 2),
                    sharding=Sharding(units=("layers.0", "layers.1", "layers.2")))
'''


def _scenarios(tmp_path):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "a_leaks_state.py").write_text(LEAKS)
    (folder / "b_plain_fp32.py").write_text(PLAIN_FP32)
    return folder


def _run(*args, out, timeout=300):
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--quiet", "--out", str(out), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    return res, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_a_cell_that_leaves_state_changed_gets_a_caveat_and_the_next_cell_starts_clean(tmp_path):
    folder = _scenarios(tmp_path)
    res, records = _run("--scenarios-dir", str(folder), "--scenario", "a_leaks_state", "--scenario", "b_plain_fp32",
                        "--world-size", "1", "--variant", "vanilla", out=tmp_path / "r.jsonl")
    assert [r["scenario"] for r in records] == ["a_leaks_state", "b_plain_fp32"]  # one slot, in this order
    leaks, plain = records
    assert leaks["launch_id"] == plain["launch_id"]  # one process ran both
    assert plain["status"] == "pass", plain["exc_msg"]  # before: "mat1 and mat2 must have the same dtype ..."
    assert leaks["status"] == "pass"
    assert leaks["left_state"] == ["left the default dtype float64", "left deterministic algorithms on"]
    assert plain["left_state"] == []
    assert res.returncode == 0, res.stdout + res.stderr

    from harness.results.report import write_outputs
    from harness.results.tables import build_tables

    written = write_outputs(build_tables([tmp_path / "r.jsonl"]), tmp_path / "report")
    for kind in ("md", "html"):
        body = written[kind].read_text()
        assert "vanilla left the default dtype float64" in body, kind
        assert "vanilla left deterministic algorithms on" in body, kind


@pytest.mark.slow
def test_a_run_and_its_shuffled_rerun_agree(tmp_path):
    """A few scenarios with patches (patch sets interleave when shuffled) and the two above,
    on one rank (one slot: the records are in run order): the same verdicts in the planned
    order, where the state-leaking scenario runs first, and in a shuffled one where it runs
    last, so a leak that were not put back would change the other one's verdict."""
    folder = _scenarios(tmp_path)
    args = ["--scenarios-dir", str(folder), "--world-size", "1"]
    for name in ("plain", "e_globally_unused_adamw", "b2_mixed_dtype_late_param", "a_leaks_state", "b_plain_fp32"):
        args += ["--scenario", name]
    _, planned = _run(*args, out=tmp_path / "planned.jsonl")
    res, shuffled = _run(*args, "--shuffle", "0", out=tmp_path / "shuffled.jsonl")
    assert "cells ran in a shuffled order (seed 0" in res.stdout
    assert {r["order_seed"] for r in shuffled} == {0} and {r["order_seed"] for r in planned} == {None}

    def order(records):
        return [(r["scenario"], r["variant"]) for r in records]

    assert order(planned) != order(shuffled) and sorted(order(planned)) == sorted(order(shuffled))
    leaks_first = [n for n, _ in order(planned) if n in ("a_leaks_state", "b_plain_fp32")]
    leaks_last = [n for n, _ in order(shuffled) if n in ("a_leaks_state", "b_plain_fp32")]
    assert leaks_first[0] == "a_leaks_state" and leaks_last == ["b_plain_fp32"] * 2 + ["a_leaks_state"] * 2
    diff = diff_runs(load_side(tmp_path / "planned.jsonl"), load_side(tmp_path / "shuffled.jsonl"))
    assert diff.verdict_changes == 0, diff.markdown()
    assert {(r["scenario"], r["variant"]): r["status"] for r in planned} == \
        {(r["scenario"], r["variant"]): r["status"] for r in shuffled}
