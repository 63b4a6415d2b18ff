import copy

import pytest
import torch
from torch import nn

from harness.spec import Optim, Scenario, Sharding, accumulate, default_forward
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


def _judged(observed, scenario=BASE, world=2):
    """``observed`` against the reference one step at a time from it (as the judge runs it)."""
    return _verdict(observed, run_reference(scenario, world, observed=observed))


def test_identical_runs_pass():
    ref = run_reference(BASE, 2)
    ok, result = _verdict(run_reference(BASE, 2), ref)
    assert ok and result.as_record_fields()["max_abs_diff"] == 0.0


def test_catches_missing_micro_batch():
    ok, result = _judged(run_reference(BASE.replace(schedule=accumulate(1)), 2))
    assert not ok
    assert result.worst().kind == "grad"


def test_catches_dropped_rank_contribution():
    def drop_rank1(model, batch, ctx):
        loss = default_forward(model, batch, ctx)
        return loss * 0 if ctx.rank == 1 else loss

    ok, result = _judged(run_reference(BASE.replace(forward=drop_rank1), 2))
    assert not ok and result.worst().kind == "grad"
    assert all(d.ok for d in result.diffs if d.kind == "param")  # stepped with what FSDP2 stepped with


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


def test_a_relative_error_of_1e_4_is_caught_in_a_small_tensor_too():
    """A fixed atol of 1e-5 let any error through in tensors below about 1e-2 (clipped grads,
    biases, 0.02-init weights): each tensor is now judged on its own scale."""
    ref = run_reference(BASE, 2)
    observed = copy.deepcopy(ref)
    g = observed[0].grads["body.layers.0.bias"]
    observed[0].grads["body.layers.0.bias"] = g * 1e-3
    ref[0].grads["body.layers.0.bias"] = g * 1e-3  # a tensor of ~1e-4
    observed[0].grads["body.layers.0.bias"] = observed[0].grads["body.layers.0.bias"] * (1 + 1e-4)
    ok, result = _verdict(observed, ref)
    assert not ok and result.worst().label == "step 0 grad body.layers.0.bias"


def test_a_wrong_optimizer_step_is_caught_and_a_rounding_difference_is_not_amplified():
    """The reference steps from FSDP2's params with FSDP2's grads: AdamW's division by each
    element's RMS cannot turn a rounding-level grad difference into a param difference, and a
    step twice too large is caught at the step where it happens."""
    observed = run_reference(BASE, 2)
    g = observed[0].grads["body.layers.0.weight"]
    i = int(g.abs().argmin())
    g.view(-1)[i] += 1e-7 * float(g.abs().max())  # rounding noise where AdamW divides by a tiny RMS
    ok, result = _judged(observed)
    assert ok, result.worst()
    doubled = run_reference(BASE.replace(optimizer=Optim(lr=2e-2)), 2)
    ok, result = _judged(doubled)
    assert not ok and result.worst().kind == "param"
    assert {d.step for d in result.diffs if not d.ok} == {0, 1, 2} and all(d.ok for d in result.diffs if d.kind == "grad")


def _perturbed(snaps, rel):
    out = copy.deepcopy(snaps)
    for s in out:
        for k, g in s.grads.items():
            if g is not None:
                s.grads[k] = g * (1 + rel)
    return out


def test_each_tensor_is_judged_by_its_own_dtype():
    """bf16 compute, fp32 reduce: the grads and master params are fp32, so a 1.5% error (a few
    bf16 ulps, far outside fp32's tolerance) is caught; an error under half a bf16 ulp in a bf16
    tensor is not."""
    mp = BASE.replace(sharding=Sharding(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    ref = run_reference(mp, 4)
    assert all(g is None or g.dtype == torch.float32 for s in ref for g in s.grads.values())
    ok, result = _verdict(_perturbed(ref, 0.015), ref)
    assert not ok and result.worst().kind == "grad" and result.worst().score > 100
    as_bf16 = copy.deepcopy(ref)
    for s in as_bf16:
        s.grads = {k: None if g is None else g.to(torch.bfloat16) for k, g in s.grads.items()}
    assert compare_runs(_perturbed(as_bf16, 0.0015), as_bf16).ok
    assert not compare_runs(_perturbed(as_bf16, 0.015), as_bf16).ok


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
