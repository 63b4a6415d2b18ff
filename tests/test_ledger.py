"""The collective ledger: recording, its stored form, scenario checks and change detection."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

from harness.results.ledger_changes import describe, ledger_summaries, run_changes, summarise, version_changes
from harness.results.record import Record
from harness.train.ledger import Entry, Ledger, at_most, check_problems, recording
from tests.support import GLOO_TIMEOUT_S, record_fields, run_ranks


def _rows(rs_dtype: str = "bfloat16", backward_gathers: int = 4) -> list[list]:
    return [[0, 0, "forward", "all_gather", 2, "bfloat16", 4, 400],
            [0, 0, "backward", "all_gather", 2, "bfloat16", backward_gathers, 100 * backward_gathers],
            [0, 0, "backward", "reduce_scatter", 2, rs_dtype, 4, 800 if rs_dtype == "float32" else 400]]


def test_ledger_counts_per_key_and_pauses():
    led = Ledger()
    led.add("all_gather", 2, "float32", 10)  # no phase yet: not recording
    led.at("forward", step=1, micro_batch=0)
    led.add("all_gather", 2, "float32", 10)
    led.add("all_gather", 2, "float32", 30)
    led.at(None)
    led.add("all_reduce", 2, "float32", 4)
    led.at("clip")
    led.add("all_reduce", 2, "float32", 4)
    assert led.rows() == [[1, 0, "forward", "all_gather", 2, "float32", 2, 40],
                          [1, None, "clip", "all_reduce", 2, "float32", 1, 4]]
    assert Ledger.from_rows(json.loads(json.dumps(led.rows()))).rows() == led.rows()
    assert led.count("all_gather", phase="forward") == 2 and led.count("all_reduce") == 1


def test_bad_row_is_a_value_error():
    with pytest.raises(ValueError, match="columns"):
        Entry.from_row([0, 0, "forward"])


def test_at_most_names_the_worst_micro_batch():
    check = at_most("all_gather", 4, phase="backward")
    assert check(Ledger.from_rows(_rows())) is None
    assert check(Ledger.from_rows(_rows(backward_gathers=7))) == \
        "7 all_gather in backward of step 0 micro-batch 0, expected at most 4"
    assert check_problems((check,), _rows(backward_gathers=7)) and check_problems((check,), None) == []



def test_record_keeps_the_ledger_and_old_records_load():
    assert Record.from_json(record_fields()).ledger is None
    rec = Record.from_json(record_fields(ledger=_rows()))
    assert Record.from_json(rec.to_json()).ledger == _rows()



def test_recording_counts_outermost_calls_and_restores(one_rank_group):
    original, original_funcol = dist.all_reduce, funcol.all_gather_single
    original_method = dist.ProcessGroup.__dict__["allreduce"]
    original_backend = torch._C._distributed_c10d.Backend.__dict__["allreduce"]
    with recording() as led:
        assert dist.all_reduce is not original
        dist.all_reduce(torch.ones(3))  # not recording yet: the harness's own
        led.at("backward", step=0, micro_batch=1)
        dist.all_reduce(torch.ones(3))
        dist.all_gather_into_tensor(torch.empty(5), torch.ones(5))  # may forward to a newer name: counts once
        dist.all_reduce(torch.ones(2, dtype=torch.bfloat16))
        funcol.all_gather_tensor(torch.ones(5), 0, dist.group.WORLD)  # 2.13+: calls funcol.all_gather_single
        group = dist.group.WORLD  # a patch may skip the module's functions: the group's and its backend's methods
        group._get_backend(torch.device("cpu")).allreduce([torch.ones(4)]).wait()
        group.allreduce([torch.ones(4)]).wait()
        group.allgather([[torch.empty(3)]], [torch.ones(3)]).wait()  # per-rank chunks: their sum is the buffer
    assert dist.all_reduce is original and funcol.all_gather_single is original_funcol
    assert dist.ProcessGroup.__dict__["allreduce"] is original_method
    assert torch._C._distributed_c10d.Backend.__dict__["allreduce"] is original_backend
    assert sorted(led.rows()) == sorted([[0, 1, "backward", "all_reduce", 1, "float32", 3, 12 + 16 + 16],
                                         [0, 1, "backward", "all_gather", 1, "float32", 3, 40 + 12],
                                         [0, 1, "backward", "all_reduce", 1, "bfloat16", 1, 4]])


def test_recording_restores_after_an_error_and_can_be_turned_off(monkeypatch):
    original = dist.reduce_scatter_tensor
    with pytest.raises(RuntimeError), recording():
        raise RuntimeError("boom")
    assert dist.reduce_scatter_tensor is original
    monkeypatch.setenv("FSDP_COMPAT_LEDGER", "0")
    with recording() as led:
        assert led is None and dist.reduce_scatter_tensor is original


def test_version_changes_in_release_order():
    base = {"device": "cpu", "scenario": "s", "world_size": 2, "variant": "vanilla"}
    records = [Record.from_json(record_fields(**base, torch=t, ledger=_rows(dtype)))
               for t, dtype in (("2.15.0+cpu", "float32"), ("2.9.1", "bfloat16"), ("2.14.1", "bfloat16"))]
    assert version_changes(ledger_summaries(records)) == [
        "reduce_scatter backward dtype bfloat16 → float32 at 2.15.0 (from 2.14.1), 1 cell: "
        "s [vanilla; cpu, w2] (bytes 400 → 800)"]


def test_a_change_of_torch_is_stated_once_with_the_cells_it_shows_in():
    records = [Record.from_json(record_fields(device="cpu", scenario=s, world_size=ws, variant=v, torch=t,
                                              ledger=_rows() if t == "2.8.0" else _rows()[1:]))
               for s, ws in (("a", 1), ("b", 2)) for v in ("vanilla", "patched") for t in ("2.8.0", "2.9.1")]
    assert version_changes(ledger_summaries(records)) == [
        "all_gather forward gone at 2.9.1 (from 2.8.0), 4 cells: a [patched, vanilla; cpu, w1] (was 4× bfloat16); "
        "b [patched, vanilla; cpu, w2] (was 4× bfloat16)"]


def test_a_change_in_many_cells_names_where_and_its_scenarios_once():
    """One behaviour of torch seen by many cells (FSDP2 stopped all-gathering at world size 1):
    one line naming where and the scenarios, not every cell with its numbers."""
    records = [Record.from_json(record_fields(device="cpu", scenario=s, world_size=ws, variant=v, torch=t,
                                              ledger=_rows() if t == "2.8.0" else _rows()[1:]))
               for s, ws in (("a", 1), ("b", 1), ("c", 2), ("d", 1)) for v in ("vanilla", "patched")
               for t in ("2.8.0", "2.9.1")]
    assert version_changes(ledger_summaries(records)) == [
        "all_gather forward gone at 2.9.1 (from 2.8.0), 8 cells at cpu w1, cpu w2, in 4 scenarios: a, b, c, d"]


def test_describe_counts_new_and_gone():
    before, after = summarise(_rows()), summarise(_rows(backward_gathers=7)[1:])
    assert describe(before, after) == ["all_gather backward count 4 → 7, bytes 400 → 700",
                                       "all_gather forward gone (was 4× bfloat16)"]
    assert describe(before, before) == []


def test_run_changes_match_an_upgrade_across_releases():
    old = {("cpu", "s", 2, "2.14.1", "vanilla"): summarise(_rows())}
    new = {("cpu", "s", 2, "2.15.0", "vanilla"): summarise(_rows("float32"))}
    assert run_changes(old, new) == ["s [vanilla, cpu, w2]: reduce_scatter backward dtype bfloat16 → float32, "
                                     "bytes 400 → 800"]
    assert run_changes(old, old) == []


def _write(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_report_and_diff_show_ledger_changes(tmp_path):
    from harness.results.diff import diff_runs, load_side
    from harness.results.report import render_markdown
    from harness.results.tables import build_tables

    base = {"scenario": "s", "world_size": 2, "variant": "vanilla"}
    old = _write(tmp_path / "old.jsonl", [record_fields(**base, torch="2.14.1", ledger=_rows())])
    new = _write(tmp_path / "new.jsonl", [record_fields(**base, torch="2.15.0", ledger=_rows("float32"))])
    line = "reduce_scatter backward dtype bfloat16 → float32"
    assert line in render_markdown(build_tables([old, new])).split("## Collective changes between torch versions")[1]
    assert f"### Collective changes\n\n- s [vanilla, cpu, w2]: {line}" in diff_runs(load_side(old), load_side(new)).markdown()


def test_reference_reduces_in_fp32_where_reduce_dtype_is_none_from_2_15():
    from harness.scenario.sharding import Sharding
    from harness.train.reference import REDUCE_NONE_FP32, quirks_for

    bf16 = Sharding(param_dtype=torch.bfloat16)
    assert REDUCE_NONE_FP32 in quirks_for(torch_version="2.15.0+cpu", backend="gloo", sharding=bf16)
    assert REDUCE_NONE_FP32 not in quirks_for(torch_version="2.14.1", backend="gloo", sharding=bf16)
    both = Sharding(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert REDUCE_NONE_FP32 not in quirks_for(torch_version="2.15.0", backend="gloo", sharding=both)


def _train_two_ranks(rank: int, store_dir: str, out: str) -> None:
    from torch import nn

    from harness.plan.cells import Cell
    from harness.spec import Clip, Scenario, Sharding
    from harness.train import fsdp

    fsdp.plain_placements = lambda params: False  # (a spawned child) gather full tensors one by one, with DTensor
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2,
                            timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        scenario = Scenario(name="t", model=lambda: nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2)),
                            batch=lambda ctx: torch.randn(2, 3), sharding=Sharding(units=("0", "1")),
                            clip=Clip(max_norm=0.1), steps=2)
        cell = Cell(index=0, scenario="t", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                    timeout_s=30)
        observed = fsdp.train(scenario, cell, None, rank, 2)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(observed[0].ledger, f)
    finally:
        dist.destroy_process_group()


def test_the_fsdp_side_records_the_scenarios_collectives_only(tmp_path):
    out = tmp_path / "ledger.json"
    run_ranks(_train_two_ranks, (str(tmp_path), str(out)))
    rows = json.loads(out.read_text())
    phases = {(r[0], r[2], r[3]): r[6] for r in rows}
    for step in (0, 1):  # the harness's snapshot gathers (DTensor full_tensor) and presence exchange are not
        assert phases[(step, "forward", "all_gather")] == 2
        assert phases[(step, "backward", "reduce_scatter")] == 2
        assert phases[(step, "clip", "all_reduce")] == 1
    assert {r[2] for r in rows} <= {"forward", "backward", "clip"}
