"""The one record type: what the worker and launcher write is what the report reads."""

import dataclasses
import json

import pytest

from harness.plan.cells import Cell
from harness.results.outcome import CellOutcome
from harness.results.reading import load_records
from harness.results.record import SCHEMA, Record, RecordError, append, finish, new_record


def _new(cell, *, run_id, launch_id, patches_module, t0, **outcome):
    """A record of ``cell`` built from its typed outcome."""
    return new_record(cell, CellOutcome(**outcome), run_id=run_id, launch_id=launch_id, patches_module=patches_module,
                      t0=t0)


def _cell(**kw):
    base = dict(index=3, scenario="b2", variant="patched", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=20.0, patches=("uniform_reduce_dtype",), scenario_patches=("uniform_reduce_dtype",),
                expected=("error", "hang"), expected_match="uniform gradient dtype", why="documented")
    return Cell(**{**base, **kw})


def test_round_trip_through_a_records_file(tmp_path):
    rec = _new(_cell(), run_id="r", launch_id="L1", patches_module="fsdp_patches", t0=1_700_000_000.0,
                     status="error", exc_type="AssertionError",
                     exc_msg="FSDP reduce-scatter expects uniform gradient dtype but got {bf16, fp32}",
                     failed_ranks=[0, 1], rank_errors={"1": "AssertionError: x"}, diffs=[{"step": 0, "ok": True}],
                     patch_install={"uniform_reduce_dtype": {"status": "installed", "reason": "wrapped"}})
    finish(rec, 1_700_000_000.0)
    assert rec.as_expected and rec.expected == ("error", "hang")
    path = tmp_path / "r.jsonl"
    append(path, rec)
    append(path, rec)
    on_disk = json.loads(path.read_text().splitlines()[0])
    assert on_disk["expected"] == "error|hang" and on_disk["schema"] == SCHEMA
    (back, src), (again, _) = load_records([path])[0]
    assert back == rec == again and src == f"{path}:1"
    assert dataclasses.asdict(Record.from_json(rec.to_json())) == dataclasses.asdict(rec)


def test_the_expectation_travels_on_the_cell():
    rec = _new(_cell(expected=("pass",), expected_match=None), run_id="r", launch_id="L", patches_module="m",
                     t0=0.0, status="mismatch", worst="step 0 grad w")
    assert not finish(rec, 0.0).as_expected
    assert (rec.scenario, rec.variant, rec.world_size, rec.mesh, rec.installed_patches) == (
        "b2", "patched", 2, [2], ["uniform_reduce_dtype"])


@pytest.mark.parametrize(("change", "problem"), [
    ({"status": "fine"}, "unknown status 'fine'"),
    ({"expected": "pass|sometimes"}, "key 'expected': unknown status 'sometimes'"),
    ({"world_size": "2"}, "key 'world_size' should be int, got str"),
    ({"as_expected": 1}, "key 'as_expected' should be bool, got int"),
    ({"failing_rank": True}, "key 'failing_rank' should be int, got bool"),
    ({"schema": 99}, "unsupported schema 99"),
])
def test_bad_fields_are_named(change, problem):
    good = _new(_cell(), run_id="r", launch_id="L", patches_module="m", t0=0.0, status="pass")
    data = json.loads(good.to_json()) | change
    with pytest.raises(RecordError, match=problem.replace("(", r"\(").replace("|", r"\|")):
        Record.from_json(data)


def test_unknown_keys_are_ignored_and_missing_ones_named():
    good = json.loads(_new(_cell(), run_id="r", launch_id="L", patches_module="m", t0=0.0,
                                 status="pass").to_json())
    assert Record.from_json(good | {"from_the_future": 1}).status == "pass"
    del good["scenario"]
    with pytest.raises(RecordError, match="missing key 'scenario'"):
        Record.from_json(good)
