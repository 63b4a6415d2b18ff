"""Sensitivity (``run --fault``, ``harness.train.faults``, ``harness.results.sensitivity``): a
fault injected on the FSDP2 side turns a passing cell into a mismatch that names every
parameter it changed; what a scenario's checks miss is its blind spot in the report."""

import json
import subprocess
import sys

import pytest
import torch

from harness.plan.cells import Cell, plan_cells
from harness.rank import judging
from harness.results.sensitivity import blind_spot_lines, blind_spots
from harness.spec import Scenario, accumulate
from harness.train import compare
from harness.train.faults import FAULTS, faulty_forward
from harness.train.reference import run_reference
from scenarios._models import MLP, randn_batch
from tests.support import ROOT, make_record

BASE = Scenario(name="base", model=MLP, batch=randn_batch(), schedule=accumulate(2))


def _cell(fault):
    return Cell(index=0, scenario="base", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=5.0, fault=fault, expected=("mismatch",))


@pytest.mark.parametrize("fault", ["drop_micro_batch", "double_rank"])
def test_a_modelled_loss_fault_is_caught_in_every_parameter_it_changes(fault):
    observed = run_reference(faulty_forward(BASE, FAULTS[fault]), 2)
    fields = judging.check_against_reference(BASE, observed, _cell(fault))
    assert fields.status == "mismatch" and fields.fault_missed == []
    assert fields.fault_affected == sorted(n for n, _ in MLP().named_parameters())


def test_what_the_checks_cannot_see_is_named(monkeypatch):
    """With a tolerance too wide to see the fault, every parameter it changed is a miss."""
    monkeypatch.setitem(compare.TOLERANCES, torch.float32, compare.Tolerance(dtype="float32", rel=10.0))
    observed = run_reference(faulty_forward(BASE, FAULTS["double_rank"]), 2)
    fields = judging.check_against_reference(BASE, observed, _cell("double_rank"))
    assert fields.fault_missed == fields.fault_affected and fields.fault_missed


def test_only_cells_documented_to_pass_are_planned_with_a_fault():
    from harness.scenario.load import load_scenarios

    library = load_scenarios([]).scenarios
    chosen = [library[n] for n in ("plain", "b2_mixed_dtype_late_param")]
    cells = plan_cells(chosen, world_sizes=[2], devices=["cpu"], variants=["vanilla", "patched"],
                       explicit_scenarios=True, torch_version="2.13.0", fault="sign_flip")
    assert [(c.scenario, c.variant) for c in cells] == [("plain", "vanilla"), ("b2_mixed_dtype_late_param", "patched")]
    assert {c.expected for c in cells} == {("mismatch",)} and {c.fault for c in cells} == {"sign_flip"}
    with pytest.raises(ValueError, match="unknown fault 'bogus'"):
        plan_cells(chosen, world_sizes=[2], devices=["cpu"], variants=["vanilla"], explicit_scenarios=True,
                   fault="bogus")


def test_the_blind_spot_table_names_the_cells_that_missed():
    recs = [make_record(scenario="plain", variant=v, fault=f, status="mismatch", expected="mismatch",
                        as_expected=True, fault_affected=["w"]) for v in ("vanilla", "deployed")
            for f in ("grad_rel", "sign_flip")]
    recs.append(make_record(scenario="blind", variant="vanilla", fault="grad_rel", status="pass", expected="mismatch",
                            as_expected=False, fault_affected=["a", "b"], fault_missed=["a", "b"]))
    table = blind_spots(recs)
    assert table.to_dict("records") == [
        {"scenario": "blind", "grad_rel": "caught 0/1; vanilla w2: missed a, b", "sign_flip": ""},
        {"scenario": "plain", "grad_rel": "caught 2/2", "sign_flip": "caught 2/2"}]
    assert blind_spot_lines(table) == ["blind, grad_rel: caught 0/1; vanilla w2: missed a, b"]


@pytest.mark.slow
def test_every_fault_is_caught_by_a_sample_of_the_library(tmp_path):
    """Every fault, injected on the FSDP2 side of plain FSDP2, HSDP with clipping and a
    mixed-precision run: each cell a mismatch naming every parameter the fault changed."""
    out = tmp_path / "faults.jsonl"
    args = [sys.executable, "-m", "harness", "run", "--quiet", "--fault", "all", "--out", str(out), "--world-size", "2",
            "--world-size", "4", "--variant", "vanilla"]
    for name in ("plain", "hsdp_clip", "mixed_precision"):
        args += ["--scenario", name]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert res.returncode == 0, res.stdout + res.stderr
    per_fault = [sum(r["fault"] == f for r in records) for f in FAULTS]
    assert set(per_fault) == {len(records) // 4} and len(records) >= 4 * 5, per_fault
    assert all(r["status"] == "mismatch" and r["fault_affected"] and not r["fault_missed"] for r in records)
