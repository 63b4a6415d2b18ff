import copy

import pytest
import torch
from torch import nn

from harness.spec import Scenario, Sharding, accumulate, default_forward
from harness.train.compare import compare_runs
from harness.train.reference import run_reference
from scenarios._models import MLP, randn_batch


class _WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = MLP()
        self.unused = nn.Linear(7, 5)

    def forward(self, x):
        return self.body(x)


BASE = Scenario(name="base", summary="", model=_WithUnused, batch=randn_batch(), schedule=accumulate(2))


def _verdict(observed, reference):
    result = compare_runs(observed, reference)
    return result.ok, result


def test_identical_runs_pass():
    ref = run_reference(BASE, 2)
    ok, result = _verdict(run_reference(BASE, 2), ref)
    assert ok and result.as_record_fields()["max_abs_diff"] == 0.0


def test_catches_missing_micro_batch():
    ok, result = _verdict(run_reference(BASE.replace(schedule=accumulate(1)), 2), run_reference(BASE, 2))
    assert not ok
    assert result.worst().kind in ("grad", "param")


def test_catches_dropped_rank_contribution():
    def drop_rank1(model, batch, ctx):
        loss = default_forward(model, batch, ctx)
        return loss * 0 if ctx.rank == 1 else loss

    ok, result = _verdict(run_reference(BASE.replace(forward=drop_rank1), 2), run_reference(BASE, 2))
    assert not ok and result.worst().kind == "grad"


def test_catches_zero_grad_where_reference_has_none():
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    assert observed[0].grads["unused.weight"] is None
    observed[0].grads["unused.weight"] = torch.zeros(5, 7)
    ok, result = _verdict(observed, ref)
    assert not ok
    worst = result.worst()
    assert (worst.kind, worst.name) == ("presence", "unused.weight") and "reference None" in worst.note


def test_catches_one_percent_error_in_one_fp32_element():
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    g = observed[1].grads["body.layers.1.weight"]
    i = int(g.abs().argmax())
    g.view(-1)[i] *= 1.01
    ok, result = _verdict(observed, ref)
    assert not ok
    assert result.worst().label == "step 1 grad body.layers.1.weight"
    assert result.worst().max_rel == pytest.approx(0.01, rel=1e-3)


def test_catches_grad_present_on_some_ranks_only():
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    observed[0].inconsistent["unused.weight"] = [0]
    ok, result = _verdict(observed, ref)
    assert not ok and "ranks [0] only" in result.worst().note


def _perturbed(snaps, rel):
    out = copy.deepcopy(snaps)
    for s in out:
        for k, g in s.grads.items():
            if g is not None:
                s.grads[k] = g * (1 + rel)
    return out


def test_each_tensor_is_judged_by_its_own_dtype():
    """bf16 compute, fp32 reduce: the grads and master params are fp32, so a 1.5% error
    (inside bf16's rtol, far outside fp32's) is caught; the same error in a bf16 tensor is not."""
    mp = BASE.replace(sharding=Sharding(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    ref = run_reference(mp, 4)
    assert all(g is None or g.dtype == torch.float32 for s in ref for g in s.grads.values())
    ok, result = _verdict(_perturbed(ref, 0.015), ref)
    assert not ok and result.worst().kind == "grad" and result.worst().score > 100
    as_bf16 = copy.deepcopy(ref)
    for s in as_bf16:
        s.grads = {k: None if g is None else g.to(torch.bfloat16) for k, g in s.grads.items()}
    assert compare_runs(_perturbed(as_bf16, 0.005), as_bf16).ok


def test_non_finite_values_are_named():
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    observed[0].grads["body.layers.0.weight"][0, 0] = float("nan")
    ok, result = _verdict(observed, ref)
    assert not ok and result.worst().note.startswith("non-finite: 1 of")
    assert result.reference_nonfinite == []
    broken_ref = copy.deepcopy(ref)
    broken_ref[1].params["body.layers.0.bias"][0] = float("inf")
    result = compare_runs(copy.deepcopy(ref), broken_ref)
    assert result.reference_nonfinite == ["step 1 param body.layers.0.bias"]


def test_record_fields_are_json_safe():
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    observed[0].grads["unused.weight"] = torch.zeros(5, 7)
    fields = compare_runs(observed, ref).as_record_fields()
    import json

    json.dumps(fields, allow_nan=False)
    assert fields["diffs"][0]["kind"] == "presence"
