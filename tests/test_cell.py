"""One cell on one rank (``harness.rank.cell``): the outcome each rank posts, how the judge
turns the slot's outcomes into a record, and when the launch must end. The slot's other
ranks are simulated through a HashStore: no processes, no training."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from harness.plan.cells import Cell
from harness.protocol import CellKeys, LaunchPlan, parse_progress, read_phase, write_phase
from harness.rank import cell as cell_mod
from harness.rank import peers
from harness.rank.cell import CellRun
from harness.rank.watchdog import Watchdog
from harness.results.reading import load_records
from harness.runconfig import RunConfig
from harness.spec import Scenario
from scenarios._models import MLP, randn_batch
from tests.support import ROOT

#: the package is missing, so its cells are skipped before training
NEEDS_PKG = Scenario(name="needs_pkg", model=MLP, batch=randn_batch(), requires=("no_such_package_fsdp_compat.sub",))


class NoUndo:
    """Stands in for ``PatchUndo``, whose snapshot imports much of torch.distributed (seconds)."""

    @classmethod
    def take(cls):
        return cls()

    def restore(self):
        pass


def _cell(index, **kw):
    base = dict(index=index, scenario="needs_pkg", variant="vanilla", device="cpu", backend="gloo", world_size=2,
                mesh=(2,), timeout_s=5.0)
    return Cell(**(base | kw))


@pytest.fixture
def make_run(tmp_path, monkeypatch):
    """A ``CellRun`` of rank ``global_rank`` over a shared HashStore; SIGALRM restored after."""
    previous = signal.getsignal(signal.SIGALRM)
    shut: list[bool] = []
    monkeypatch.setattr(peers, "shutdown_peer_sockets", lambda: shut.append(True) or True)  # the test process's own
    store = dist.HashStore()
    made = []

    def make(global_rank=0, **plan_kw):
        plan = LaunchPlan(**(dict(run_id="r1", launch_id="L3", device="cpu", world_size=4, config=RunConfig(patches="fsdp_patches", patch_mapping={}),
                                   patches_module_id="fsdp_patches@x", out_path=str(tmp_path / "out.jsonl"),
                                  folder=str(tmp_path / "launch")) | plan_kw))
        plan.dump()
        wd = Watchdog(plan.stamp_file(global_rank), on_expire=lambda: None)
        made.append(wd)
        return CellRun(plan=plan, store=store, watchdog=wd, scenarios={"needs_pkg": NEEDS_PKG})

    make.store, make.shut = store, shut
    yield make
    for wd in made:
        wd.disarm()
    signal.signal(signal.SIGALRM, previous)


def _records(run):
    found, skipped = load_records([run.plan.out_path])
    assert skipped == []
    return [r for r, _ in found]


def _keys(index):
    return CellKeys(launch_id="L3", index=index)


def test_world_size_1_skip_is_recorded_and_the_launch_goes_on(make_run):
    run = make_run()
    assert run.run_cell(_cell(0, world_size=1, mesh=(1,)), slot_rank0=0, rank=0) is True
    [rec] = _records(run)
    assert (rec.cell, rec.launch_id, rec.run_id, rec.scenario, rec.status) == (0, "L3", "r1", "needs_pkg", "skip")
    assert "needs the Python package(s) no_such_package_fsdp_compat" in rec.reason
    # the scenario does not declare the lack of a package: not as documented, whatever the status
    assert rec.missing == "Python package(s) no_such_package_fsdp_compat" and not rec.as_expected
    assert run.store.check([_keys(0).recorded]) and not run.store.check([_keys(0).abandoned])
    assert json.loads(run.store.get(_keys(0).status(0)))["ok"] is True
    assert read_phase(run.plan.stamp_file(0)) == "idle"


def test_the_slots_first_rank_marks_the_start_with_global_ranks(make_run):
    run = make_run(global_rank=2)
    run.store.set(_keys(1).recorded, "1")
    run_1 = make_run(global_rank=3)
    run_1.run_cell(_cell(1), slot_rank0=2, rank=1)  # not the first rank: no progress line
    assert run.plan.progress_file.read_text() == ""
    run.store.delete_key(_keys(1).recorded)
    run.run_cell(_cell(1), slot_rank0=2, rank=0)
    [line] = run.plan.progress_file.read_text().splitlines()
    assert (parse_progress(line).cell, parse_progress(line).ranks) == (1, (2, 3))


def test_a_cell_that_may_end_its_process_goes_to_the_zygote(make_run):
    run = make_run()
    calls = []

    class FakeZygote:
        def run_cell(self, run_, cell, *, slot_rank0, rank, t0):
            calls.append((run_ is run, cell.index, slot_rank0, rank))
            return True

    run.zygote = FakeZygote()
    assert run.run_cell(_cell(4, expected=("crash",)), slot_rank0=2, rank=1) is True
    assert calls == [(True, 4, 2, 1)]
    assert not run.store.check([_keys(4).status(1)])  # it did not run here


def test_the_judge_blames_a_peers_error(make_run):
    run = make_run()
    peers.post(run.store, _keys(2), peers.RankOutcome(rank=0, ok=True))
    peers.post(run.store, _keys(2), peers.RankOutcome(rank=1, ok=False, exc_type="RuntimeError", exc_msg="planted",
                                                      t_fail=time.time()))
    assert run.judge(_cell(2), t0=time.time(), slot_rank0=0) == []
    [rec] = _records(run)
    assert (rec.status, rec.exc_type, rec.exc_msg, rec.failing_rank, rec.failed_ranks) == \
        ("error", "RuntimeError", "planted", 1, [1])
    assert rec.as_expected is False
    assert run.store.check([_keys(2).recorded]) and not run.store.check([_keys(2).abandoned])


def test_a_rank_that_never_reports_abandons_the_launch(make_run):
    run = make_run(global_rank=2)
    write_phase(run.plan.stamp_file(3), "step 1 clip")  # the silent rank's last stamp (global rank 3)
    peers.post(run.store, _keys(2), peers.RankOutcome(rank=0, ok=False, exc_type="CellTimeout", exc_msg="x",
                                                      phase="step 1 clip", where="recv (c10d.py:1)", in_collective=True))
    t = time.time()
    missing = run.judge(_cell(2, expected=("hang",)), t0=t - 10, slot_rank0=2)
    assert missing == [1] and time.time() - t < 5
    assert run.store.check([_keys(2).abandoned, _keys(2).recorded])
    [rec] = _records(run)
    assert (rec.status, rec.failing_rank, rec.failed_ranks, rec.as_expected) == ("hang", 1, [0, 1], True)
    assert "rank 1 never reported (last in 'step 1 clip')" in rec.exc_msg


def test_a_rank_other_than_the_judge_waits_for_the_record(make_run):
    run = make_run(global_rank=1)
    run.store.set(_keys(5).recorded, "1")
    assert run.run_cell(_cell(5), slot_rank0=0, rank=1) is True
    assert json.loads(run.store.get(_keys(5).status(1)))["ok"] is True
    run.store.set(_keys(6).recorded, "1")
    run.store.set(_keys(6).abandoned, "0")  # the judge gave up on a rank: this launch must end
    assert run.run_cell(_cell(6), slot_rank0=0, rank=1) is False
    assert not Path(run.plan.out_path).exists()  # only the judge writes records


def test_a_patches_module_that_cannot_load_is_an_install_error(make_run, tmp_path, monkeypatch):
    monkeypatch.setattr(cell_mod, "PatchUndo", NoUndo)
    run = make_run(config=RunConfig(patches=str(tmp_path / "absent_patches.py")))
    cell = _cell(7, world_size=1, mesh=(1,), variant="patched", patches=("p1",), scenario_patches=("p1",))
    assert run.run_cell(cell, slot_rank0=0, rank=0) is True
    [rec] = _records(run)
    assert (rec.status, rec.exc_type) == ("error", "PatchInstallError")
    assert rec.exc_msg == f"patch install error: p1: patches module file not found: {tmp_path / 'absent_patches.py'}"


def test_a_patches_module_that_exits_at_import_is_named_not_recorded_as_0(make_run, tmp_path, monkeypatch):
    monkeypatch.setattr(cell_mod, "PatchUndo", NoUndo)
    quits = tmp_path / "quits_patches.py"
    quits.write_text("import sys\n\nsys.exit(0)\n")
    run = make_run(config=RunConfig(patches=str(quits)))
    cell = _cell(7, world_size=1, mesh=(1,), variant="patched", patches=("p1",), scenario_patches=("p1",))
    assert run.run_cell(cell, slot_rank0=0, rank=0) is True
    [rec] = _records(run)
    assert (rec.status, rec.exc_type) == ("error", "PatchInstallError")
    assert rec.exc_msg == "patch install error: p1: patches module exited at import (SystemExit 0)"


def test_a_patch_set_whose_import_hangs_is_recorded_and_not_retried(make_run, monkeypatch):
    monkeypatch.setattr(cell_mod, "PatchUndo", NoUndo)
    run = make_run(config=RunConfig(patches=str(ROOT / "tests" / "fixtures" / "sleepy_import_patches.py")))
    first = _cell(8, world_size=1, mesh=(1,), variant="patched", timeout_s=0.3, patches=("p1",), scenario_patches=("p1",))
    t = time.time()
    assert run.run_cell(first, slot_rank0=0, rank=0) is True
    assert time.time() - t < 5 and run.hung_sets == {("p1",): 8}
    assert make_run.shut == [True]  # a failed rank shuts its collective sockets
    outcome = json.loads(run.store.get(_keys(8).status(0)))
    assert (outcome["exc_type"], outcome["phase"], outcome["in_collective"]) == ("CellTimeout", "import patches", False)
    t = time.time()
    assert run.run_cell(_cell(9, **{k: getattr(first, k) for k in ("world_size", "mesh", "variant", "patches")}),
                        slot_rank0=0, rank=0) is True
    assert time.time() - t < 2  # not imported again
    hung, skipped = _records(run)
    assert (hung.status, hung.exc_type, hung.failing_rank) == ("hang", "CellTimeout", 0)
    assert hung.exc_msg.startswith("no result within 0.3 s: rank(s) [0] (rank 0 was in ")
    assert "during 'import patches'" in hung.exc_msg
    assert (skipped.status, skipped.exc_msg) == ("hang", "not run: installing this patch set hung in cell 8 of this launch")
