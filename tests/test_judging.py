"""Judging (``harness.rank.judging``): the reference one step at a time from what FSDP2
produced, the gloo AVG sum modelled only where declared, a sum anywhere else a finding."""

import copy
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from harness.plan.cells import Cell
from harness.rank import judging
from harness.spec import Scenario
from harness.train.reference import GLOO_AVG_FIX, GLOO_AVG_SUMS, run_reference
from tests.support import ROOT


def _linear():
    return nn.Linear(3, 2, bias=False)


def _scenario(**kw):
    return Scenario(name="lin", summary="", model=_linear, batch=lambda ctx: torch.randn(2, 3), steps=2, **kw)


def _cell(world_size=2, backend="gloo"):
    return Cell(index=0, scenario="lin", variant="vanilla", device="cpu", backend=backend, world_size=world_size,
                mesh=(world_size,), timeout_s=5.0)


def _as_observed(snaps, sums):
    observed = copy.deepcopy(snaps)
    observed[0].reduction_sums = sums
    return observed


def test_a_faithful_run_passes_with_no_quirk_and_no_finding(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    s = _scenario()
    fields = judging.check_against_reference(s, _as_observed(run_reference(s, 2), False), _cell())
    assert fields.status == "pass" and fields.reference_quirks == [] and not fields.findings


def test_the_gloo_sum_is_modelled_where_declared_and_only_where_measured(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    s = _scenario()
    summed = run_reference(s, 2, quirks=[GLOO_AVG_SUMS])
    fields = judging.check_against_reference(s, _as_observed(summed, True), _cell())
    assert fields.status == "pass" and fields.reference_quirks == [GLOO_AVG_SUMS]
    # measured no sum (a fix under another name): judged against the mean
    fields = judging.check_against_reference(s, _as_observed(run_reference(s, 2), False), _cell())
    assert fields.status == "pass" and fields.reference_quirks == []


def test_a_sum_where_none_is_declared_is_a_finding_and_a_mismatch(monkeypatch):
    s = _scenario()
    summed = run_reference(s, 2, quirks=[GLOO_AVG_SUMS])
    monkeypatch.setattr(torch, "__version__", "2.10.0+cpu")  # fixed upstream in 2.9
    fields = judging.check_against_reference(s, _as_observed(summed, True), _cell())
    assert fields.status == "mismatch" and fields.reference_quirks == []
    assert fields.findings == ["gloo reduction summed where FSDP2 asks for an average (on torch 2.10.0+cpu): "
                                  "judged against the true mean"]
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")  # the bug's torch, but its fix is in force
    fields = judging.check_against_reference(s, _as_observed(summed, True), _cell(), {GLOO_AVG_FIX: {"status": "installed"}})
    assert fields.status == "mismatch" and "with its fix installed" in fields.findings[0]


def test_a_scenario_that_reports_the_sum_itself_gets_no_quirk_and_no_finding(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    s = _scenario(reference_quirks=False)
    fields = judging.check_against_reference(s, _as_observed(run_reference(s, 2, quirks=[GLOO_AVG_SUMS]), True), _cell())
    assert fields.status == "mismatch" and fields.reference_quirks == [] and not fields.findings


def test_observed_snapshots_survive_the_file_between_processes(tmp_path):
    s = _scenario()
    observed = _as_observed(run_reference(s, 2), False)
    judging.save_observed(tmp_path / "o.pt", observed)
    back = judging.load_observed(tmp_path / "o.pt")
    assert judging.check_against_reference(s, back, _cell()) == judging.check_against_reference(s, observed, _cell())


@pytest.mark.slow
@pytest.mark.parametrize("module, worst", [("self_judging_clip.py", "clipped"), ("self_judging_optimizer.py", "param")])
def test_a_patch_set_that_changes_clipping_or_the_optimizer_is_judged_against_stock_torch(tmp_path, module, worst):
    """The reference runs in a process forked before any patch was installed: a module that
    replaces clip_grad_norm_ or an optimizer step is not compared with itself (before: pass,
    max |diff| 0)."""
    out = tmp_path / "r.jsonl"
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--quiet", "--scenario", "plain", "--world-size", "2",
                          "--variant", "vanilla", "--variant", "deployed", "--patches",
                          str(ROOT / "tests" / "fixtures" / module), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    by = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert by["vanilla"]["status"] == "pass", res.stdout + res.stderr
    deployed = by["deployed"]
    assert deployed["status"] == "mismatch" and f" {worst} " in deployed["worst"], deployed["worst"]
    assert deployed["max_abs_diff"] > 0 and res.returncode == 1


def test_the_reference_runs_on_the_cells_device_and_says_where_it_could_not():
    cpu = _cell()
    assert judging.reference_device(cpu) == (torch.device("cpu"), None)
    cuda = copy.replace(cpu, device="cuda", backend="nccl") if hasattr(copy, "replace") else \
        Cell(**{**cpu.__dict__, "device": "cuda", "backend": "nccl"})
    if torch.cuda.is_available():
        assert judging.reference_device(cuda) == (torch.device("cuda", torch.cuda.current_device()), None)
    else:  # this machine: the reference falls back to the CPU, and the record's quirks say so
        assert judging.reference_device(cuda) == (torch.device("cpu"), judging.CPU_REFERENCE)
