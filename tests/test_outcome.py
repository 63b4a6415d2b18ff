"""A cell's outcome is one typed part (``harness.results.outcome.CellOutcome``): what the judge,
the blame, a skip and the launcher build, what travels as JSON, and what the record inherits."""

import dataclasses
import json

import pytest

from harness.plan.cells import Cell
from harness.results.outcome import CellOutcome
from harness.results.record import Record, new_record


def test_it_travels_as_json_and_back_unchanged():
    out = CellOutcome(status="mismatch", worst="step 0 grad w", diffs=[{"step": 0, "ok": False}],
                      patch_install={"p": {"status": "installed", "reason": ""}}, findings=["summed"])
    data = json.loads(json.dumps(out.to_json()))
    assert set(data) == {"status", "worst", "diffs", "patch_install", "findings"}  # defaults stay off the wire
    assert CellOutcome.from_json(data) == out


def test_a_field_it_does_not_have_is_an_error_not_dropped():
    with pytest.raises(ValueError, match="not fields of a cell's outcome: wrost"):
        CellOutcome.from_json({"status": "pass", "wrost": "x"})
    with pytest.raises(TypeError, match="no field 'wrost'"):
        CellOutcome(status="pass").update(wrost="x")


def test_the_record_is_the_cell_its_outcome_and_its_environment():
    outcome_fields = {f.name for f in dataclasses.fields(CellOutcome)}
    assert outcome_fields <= {f.name for f in dataclasses.fields(Record)}
    cell = Cell(index=1, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=9.0, why="documented")
    out = CellOutcome(status="error", exc_type="ValueError", exc_msg="bad", failing_rank=1, left_state=["left x"])
    rec = new_record(cell, out, run_id="r", launch_id="L", patches_module="m", t0=0.0, order_seed=7)
    assert {k: getattr(rec, k) for k in outcome_fields} == {**dataclasses.asdict(out), "reason": "documented"}
    assert (rec.scenario, rec.world_size, rec.order_seed, rec.timeout_s) == ("s", 2, 7, 9.0) and rec.torch
    skip = new_record(cell, CellOutcome(status="skip", reason="needs a GPU"), run_id="r", launch_id="L",
                      patches_module="m", t0=0.0)
    assert skip.reason == "needs a GPU"  # the outcome's reason over the cell's
