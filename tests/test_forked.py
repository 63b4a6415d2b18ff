"""Cells and references run in processes forked from a zygote (``harness.rank.forked``): what
the worker posts and how it judges when the cell's process succeeds, aborts, hangs or exits,
and what it records when the referee answers, hangs or dies (``harness.rank.referee``).

The function that runs a cell in the forked process is replaced by small stand-ins (chosen
per cell index), so no torchrun and no training is involved; the store is a real TCPStore,
which the forked processes reach as clients, as the real ones do.
"""

import datetime
import json
import os
import resource
import signal
import socket
import time
from dataclasses import dataclass, field

import psutil
import pytest
import torch
import torch.distributed as dist

from harness.plan.cells import Cell
from harness.process.tree import die_with_parent
from harness.protocol import CellKeys, LaunchPlan, write_phase
from harness.rank import forked, peers, referee
from harness.rank.forked import Zygote
from harness.rank.leaks import TorchAttributes
from harness.results.outcome import CellOutcome
from harness.runconfig import RunConfig

WHAT = "[enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(port):
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=10))


# -- what a forked cell's process does, by cell index (runs in the fork; never returns) --
def _records(plan, port, keys, rank):
    peers.post(_client(port), keys, peers.RankOutcome(rank=rank, ok=True))
    _client(port).set(keys.recorded, "1")
    os._exit(0)


def _reports_then_aborts(plan, port, keys, rank):
    peers.post(_client(port), keys, peers.RankOutcome(rank=rank, ok=False, exc_type="RuntimeError", exc_msg="own report"))
    os.abort()


def _aborts(plan, port, keys, rank, slot_rank0):
    write_phase(plan.stamp_file(slot_rank0 + rank), "step 1 micro-batch 0 backward")
    os.abort()


def _hangs(*_):
    time.sleep(60)


def _exits_3(*_):
    os._exit(3)


BEHAVIOUR = {1: _records, 2: _reports_then_aborts, 3: _aborts, 4: _hangs, 5: _exits_3}


def _fake_cell_process(plan, scenarios, baseline, *, start, index, slot_rank0, rank, t0):
    try:
        die_with_parent()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        keys = CellKeys(launch_id=plan.launch_id, index=index)
        args = (plan, scenarios["port"], keys, rank) + ((slot_rank0,) if BEHAVIOUR[index] is _aborts else ())
        BEHAVIOUR[index](*args)
    finally:
        os._exit(4)


def _fake_reference(plan, scenarios, baseline, *, start, index, installs):
    """The referee's work by cell index: answers (1), answers having had to put something
    back (2), hangs (4), dies (3)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if index in (1, 2):
        plan.verdict_file(index).write_text(json.dumps(CellOutcome(status="pass", patch_install=installs).to_json()))
        return index == 1
    if index == 4:
        time.sleep(60)
    os.abort()


@dataclass
class FakeRun:
    """The ``CellRun`` side the zygote's worker end calls back into."""

    plan: LaunchPlan
    store: dist.Store
    calls: list = field(default_factory=list)
    hung_sets: dict = field(default_factory=dict)

    def run_here(self, cell, *, slot_rank0, rank, t0):
        self.calls.append(("run_here", cell.index, slot_rank0, rank))
        return True

    def judge(self, cell, *, t0, slot_rank0, forked=False):
        self.calls.append(("judge", cell.index, slot_rank0, forked))
        self.store.set(CellKeys(launch_id=self.plan.launch_id, index=cell.index).recorded, "1")
        return []

    def wait_recorded(self, cell, *, t0):
        self.calls.append(("wait_recorded", cell.index))
        return True


def _cell(index, timeout_s=30.0):
    return Cell(index=index, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=timeout_s, expected=("crash",))


def _plan(tmp_path, cells):
    """A launch plan of ``cells``, written to its folder."""
    plan = LaunchPlan(run_id="r", launch_id="L", device="cpu", world_size=4, config=RunConfig(patches="m", patch_mapping={}),
                      patches_module_id="m", out_path=str(tmp_path / "out.jsonl"), folder=str(tmp_path / "launch"),
                      cells=cells)
    plan.dump()
    return plan


@pytest.fixture
def zygote(tmp_path, monkeypatch):
    """A zygote (forked first, as the worker does) and a store the cells' processes reach."""
    plan = _plan(tmp_path, [_cell(i) for i in BEHAVIOUR])
    plan.log_file.write_text(f"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  {WHAT}\n")
    monkeypatch.setattr(forked, "_cell_process", _fake_cell_process)
    monkeypatch.setattr(referee, "_judge_one", _fake_reference)
    port = _free_port()
    z = Zygote.start(plan, {"port": port}, TorchAttributes())
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
    pids: list[int] = []
    fork = z.fork
    z.fork = lambda *a, **kw: pids.append(fork(*a, **kw)) or pids[-1]
    try:
        yield z, FakeRun(plan=plan, store=store), pids
    finally:
        z.close()  # the zygote's loop ends
        for p in psutil.Process(z.pid).children(recursive=True) if psutil.pid_exists(z.pid) else []:
            p.kill()
        _reap(z.pid)


def _reap(pid, timeout_s=10.0):
    deadline = time.time() + timeout_s
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.time() < deadline:
            time.sleep(0.01)
    except ChildProcessError:  # reaped already
        pass


def _status(run, index, rank):
    keys = CellKeys(launch_id="L", index=index)
    return peers.RankOutcome(**json.loads(run.store.get(keys.status(rank)))) if run.store.check([keys.status(rank)]) else None


def test_the_worker_judges_a_cell_its_process_posted(zygote):
    z, run, _ = zygote
    assert z.run_cell(run, _cell(1), slot_rank0=0, rank=0, t0=time.time()) is True
    assert _status(run, 1, 0) == peers.RankOutcome(rank=0, ok=True) and run.calls == [("judge", 1, 0, True)]


def _gone(pid, timeout_s=5.0):
    deadline = time.time() + timeout_s
    while psutil.pid_exists(pid) and time.time() < deadline:
        time.sleep(0.01)
    return not psutil.pid_exists(pid)


def test_the_referee_serves_on_until_it_had_to_put_something_back(zygote):
    z, run, pids = zygote
    fields = z.reference(run.plan, _cell(1), {"p": {"status": "installed"}}, time.time() + 10)
    assert fields == CellOutcome(status="pass", patch_install={"p": {"status": "installed"}})
    assert z.reference(run.plan, _cell(1), {}, time.time() + 10) == CellOutcome(status="pass")
    assert len(pids) == 1 and z.referee is not None and z.referee.pid == pids[0]  # one process, two references
    assert z.reference(run.plan, _cell(2), {}, time.time() + 10).status == "pass"  # answered, then it ends
    assert z.referee is None and _gone(pids[0])
    assert z.reference(run.plan, _cell(1), {}, time.time() + 10).status == "pass"
    assert len(pids) == 2 and z.referee.pid == pids[1]  # a fresh one


def test_with_isolate_fork_a_referee_serves_one_reference(zygote):
    z, run, pids = zygote
    z.one_reference_each = True
    for _ in range(2):
        assert z.reference(run.plan, _cell(1), {}, time.time() + 10).status == "pass"
    assert len(pids) == 2 and z.referee is None and _gone(pids[0]) and _gone(pids[1])


def test_the_referees_hang_and_death_are_named_and_the_next_reference_gets_a_fresh_one(zygote):
    z, run, pids = zygote
    t = time.time()
    assert z.reference(run.plan, _cell(4), {}, t + 0.3) == CellOutcome(status="hang", exc_type="CellTimeout",
                                                                      exc_msg="reference/compare timed out")
    assert time.time() - t < 5 and _gone(pids[0]) and z.referee is None
    died = z.reference(run.plan, _cell(3), {}, time.time() + 10)
    assert (died.status, died.exc_msg) == ("error", "reference/compare failed: its process died: signal 6 (SIGABRT)")
    assert len(pids) == 2 and _gone(pids[1])
    assert z.reference(run.plan, _cell(1), {}, time.time() + 10).status == "pass" and len(pids) == 3


def test_a_non_judge_rank_killed_by_a_signal_is_posted_as_the_crash(zygote):
    z, run, _ = zygote
    assert z.run_cell(run, _cell(3), slot_rank0=2, rank=1, t0=time.time()) is True
    outcome = _status(run, 3, 1)
    assert (outcome.ok, outcome.exc_type) == (False, "Signal")
    assert outcome.exc_msg == f"rank 1 died: signal 6 (SIGABRT): {WHAT}"
    assert outcome.phase == "step 1 micro-batch 0 backward"  # from global rank 3's phase file
    assert run.calls == [("wait_recorded", 3)]


def test_the_judge_killed_by_a_signal_judges_in_the_worker(zygote):
    z, run, _ = zygote
    assert z.run_cell(run, _cell(3), slot_rank0=0, rank=0, t0=time.time()) is True
    assert _status(run, 3, 0).exc_msg.startswith("rank 0 died: signal 6 (SIGABRT)")
    assert run.calls == [("judge", 3, 0, True)]


def test_a_rank_that_reported_before_dying_keeps_its_report(zygote):
    z, run, pids = zygote
    assert z.run_cell(run, _cell(2), slot_rank0=0, rank=0, t0=time.time()) is True
    status = _status(run, 2, 0)
    # seen once in CI (2026-12-07) with no status at all: say whether the zygote forked and lived
    assert status is not None, (run.calls, pids, psutil.pid_exists(z.pid))
    assert (status.exc_type, status.exc_msg) == ("RuntimeError", "own report")
    assert run.calls == [("judge", 2, 0, True)]


def test_an_exit_without_a_report_posts_the_exit_code_and_phase(zygote):
    """The cell's process ended without a report or a signal (user code called ``os._exit``):
    the worker posts that as a crash of the rank, naming the exit code and where it was."""
    z, run, _ = zygote
    write_phase(run.plan.stamp_file(0), "install patches: p1")
    assert z.run_cell(run, _cell(5), slot_rank0=0, rank=0, t0=time.time()) is True
    status = _status(run, 5, 0)
    assert (status.exc_type, status.exc_msg) == ("ExitCode", "rank 0 exited with code 3 during install of patch p1")
    assert run.calls == [("judge", 5, 0, True)]
    assert peers.blame([status], {}, 5.0).status == "crash"


def test_a_hung_cell_process_is_killed_at_its_deadline_and_the_zygote_serves_on(zygote, monkeypatch):
    z, run, pids = zygote
    monkeypatch.setattr(forked, "_CHILD_GRACE_S", 0.3)
    t = time.time()
    assert z.run_cell(run, _cell(4, timeout_s=0.2), slot_rank0=0, rank=1, t0=t) is True
    assert 0.5 <= time.time() - t < 5
    assert _status(run, 4, 1).exc_msg.startswith("rank 1 died: signal 9 (SIGKILL)")
    assert not psutil.pid_exists(pids[0])  # killed and reaped
    assert run.calls == [("wait_recorded", 4)]
    assert z.run_cell(run, _cell(1), slot_rank0=0, rank=1, t0=time.time()) is True  # the next cell is served
    assert _status(run, 1, 1) == peers.RankOutcome(rank=1, ok=True) and len(pids) == 2


def test_without_its_zygote_the_worker_runs_the_cell_itself(zygote):
    z, run, pids = zygote
    os.kill(z.pid, signal.SIGKILL)
    _reap(z.pid)
    assert z.run_cell(run, _cell(1), slot_rank0=2, rank=1, t0=time.time()) is True
    assert pids == [None] and run.calls == [("run_here", 1, 2, 1)]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs affinity control and two cores")
def test_the_zygote_runs_on_the_cores_its_worker_had_before_it_was_pinned_what_it_forks_on_the_ranks(tmp_path, monkeypatch):
    from harness.process import cpus

    cores = sorted(os.sched_getaffinity(0))
    plan = _plan(tmp_path, [_cell(1)])
    seen = tmp_path / "seen"

    def cell_sees(*_, start, **__):
        told, reads = start.state.interop_threads, torch.get_num_interop_threads()
        seen.write_text(f"{sorted(os.sched_getaffinity(0))} {told} {reads}")
        os._exit(0)

    monkeypatch.setattr(forked, "_cell_process", cell_sees)
    # torch 2.14+ sizes an inter-op pool not made yet by the cores the process may run on: the
    # cells' start state must be read as pinned, or every forked cell "changed" it (2 -> 1)
    monkeypatch.setattr(torch, "get_num_interop_threads", lambda: len(os.sched_getaffinity(0)))
    monkeypatch.setattr(cpus, "_BEFORE", cores)  # as ``pin_rank`` leaves them
    monkeypatch.setattr(cpus, "_CORE", cores[1:2])
    os.sched_setaffinity(0, cores[1:2])
    try:
        z = Zygote.start(plan, {}, TorchAttributes())
    finally:
        os.sched_setaffinity(0, cores)
    try:
        deadline = time.time() + 10
        while sorted(psutil.Process(z.pid).cpu_affinity()) != cores and time.time() < deadline:
            time.sleep(0.01)
        assert sorted(psutil.Process(z.pid).cpu_affinity()) == cores
        pid = z.fork(dict(kind="cell", index=1, slot_rank0=0, rank=0, t0=time.time()))
        assert os.WIFEXITED(z.wait(pid, time.time() + 10))
        assert seen.read_text() == f"{cores[1:2]} 1 1"
    finally:
        z.close()
        _reap(z.pid)
