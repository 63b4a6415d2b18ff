"""harness.rank.groups: the default group is kept only between healthy cells that made no
other group, and never across a change of patch set."""

import os
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from harness.rank.cell import CellRun
from harness.rank.groups import CellGroups, ProbeCache, keep_group
from harness.rank.peers import RankOutcome
from harness.rank.watchdog import Watchdog
from harness.runconfig import RunConfig

CELL = SimpleNamespace(backend="gloo", world_size=1, timeout_s=30)


@pytest.fixture
def groups(tmp_path):
    made = CellGroups()
    n = iter(range(100))
    yield made, lambda: dist.FileStore(str(tmp_path / f"store{next(n)}"), 1)
    made.release()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_destroyed_group_is_freed_by_the_next_release_and_never_by_a_forked_process(groups):
    """Freeing a gloo group joins its worker threads, which may still be dropping a finished
    collective's tensors: before torch 2.8 that needed the GIL the freeing thread held
    (2.7.1 deadlocked in destroy_process_group now and then). So a release frees the groups
    the release before it destroyed, and a forked process never frees its parent's."""
    from harness.rank import groups as module

    g, store = groups
    g.release()  # whatever an earlier test left: freed
    g.release()
    before = _threads()
    g.open(CELL, slot_rank0=0, rank=0, store=store())
    dist.all_reduce(__import__("torch").ones(1))
    opened = _threads()
    assert opened > before
    g.release()
    assert not dist.is_initialized() and _threads() == opened  # destroyed, not yet freed
    pid = os.fork()
    if pid == 0:  # the child has none of the group's threads: freeing it here would join threads not here
        module.release(failed=False)
        os._exit(0 if module._INHERITED and module._DESTROYED == (os.getpid(), []) else 3)
    deadline = time.time() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.time() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
    g.release()
    assert _threads() <= before  # freed by the next release: its threads are gone


def test_a_healthy_cell_leaves_the_default_group_to_the_next(groups):
    g, store = groups
    assert g.open(CELL, slot_rank0=0, rank=0, store=store()) is False
    first = dist.group.WORLD
    init_device_mesh("cpu", (1,))  # a 1-D mesh over the world uses the default group itself
    dist.all_reduce(__import__("torch").ones(1))
    seq = g.after_cell(failed=False)
    assert isinstance(seq, int) and seq > 0 and dist.is_initialized()
    g.settle(keep=True)
    assert g.open(CELL, slot_rank0=0, rank=0, store=store()) is True
    assert dist.group.WORLD is first and (g.made, g.reused) == (1, 1)


def test_a_cell_that_made_another_group_tears_everything_down(groups):
    g, store = groups
    g.open(CELL, slot_rank0=0, rank=0, store=store())
    dist.new_group([0])  # as HSDP's meshes make groups of their own
    assert len(dist.distributed_c10d._world.pg_map) > 1
    assert g.after_cell(failed=False) is None and not dist.is_initialized()
    assert g.open(CELL, slot_rank0=0, rank=0, store=store()) is False and g.made == 2


def test_a_failure_or_the_judges_no_tears_it_down(groups):
    g, store = groups
    g.open(CELL, slot_rank0=0, rank=0, store=store())
    assert g.after_cell(failed=True) is None and not dist.is_initialized()
    g.open(CELL, slot_rank0=0, rank=0, store=store())
    assert g.after_cell(failed=False) is not None
    g.settle(keep=False)
    assert not dist.is_initialized() and g.kept is None


def test_another_slot_backend_or_timeout_gets_a_new_group(groups):
    g, store = groups
    g.open(CELL, slot_rank0=0, rank=0, store=store())
    g.after_cell(failed=False)
    g.settle(keep=True)
    assert g.open(SimpleNamespace(backend="gloo", world_size=1, timeout_s=31), slot_rank0=0, rank=0,
                  store=store()) is False


@pytest.mark.parametrize("outcomes, missing, keep", [
    ([RankOutcome(rank=0, ok=True, group_seq=4), RankOutcome(rank=1, ok=True, group_seq=4)], [], True),
    ([RankOutcome(rank=0, ok=True, group_seq=4), RankOutcome(rank=1, ok=True, group_seq=5)], [], False),
    ([RankOutcome(rank=0, ok=True, group_seq=4), RankOutcome(rank=1, ok=False, group_seq=None)], [], False),
    ([RankOutcome(rank=0, ok=True, group_seq=4)], [1], False),
    ([RankOutcome(rank=0, ok=True, group_seq=None)], [], False),
])
def test_the_judge_keeps_it_only_when_every_rank_issued_the_same_collectives(outcomes, missing, keep):
    assert keep_group(outcomes, missing) is keep


def _healthy_cell(g, store) -> None:
    g.open(CELL, slot_rank0=0, rank=0, store=store)
    g.after_cell(failed=False)
    g.settle(keep=True)


@pytest.fixture
def patches_modules_kept():
    """The test re-imports fsdp_patches (a patch-set switch does): other tests of this process
    keep the module objects they imported."""
    import sys

    kept = {n: m for n, m in sys.modules.items() if n == "fsdp_patches" or n.startswith("fsdp_patches.")}
    yield
    for name in [n for n in sys.modules if n == "fsdp_patches" or n.startswith("fsdp_patches.")]:
        del sys.modules[name]
    sys.modules.update(kept)


def test_a_change_of_patch_set_releases_the_group_before_its_snapshot_and_undo(groups, patches_modules_kept):
    """The undo puts back torch.distributed's module state as its snapshot saw it, the group
    counter included: a group kept across it would share its name with the next group made,
    and destroying that one would unregister it ("Could not resolve the process group
    registered under the name 0", measured before the fix)."""
    g, store = groups
    run = CellRun(plan=SimpleNamespace(config=RunConfig(patches="fsdp_patches", patch_mapping={})), store=None,
                  watchdog=Watchdog(None, on_expire=lambda: None), scenarios={}, groups=g)
    run._activate(("uniform_reduce_dtype",))  # snapshot taken with no group
    _healthy_cell(g, store())
    run._activate(())  # back to vanilla: the undo
    assert not dist.is_initialized() and g.kept is None
    _healthy_cell(g, store())
    sub = dist.new_group([0])  # a cell's own group (a mesh of its own), destroyed after it
    assert sub.group_name != dist.group.WORLD.group_name
    dist.destroy_process_group(sub)
    init_device_mesh("cpu", (1,)).get_group()  # resolves the default group by its name


def test_probe_answers_are_kept_only_after_a_cell_every_rank_trained_through():
    """A rank that finds an answer skips the probe's collectives: a slot's ranks must hold the
    same answers, so a cell's answers wait for the judge's word that no rank failed."""
    probes = ProbeCache()
    key = ("gloo", "cpu", (0, 1), "torch.float32")
    assert probes.begin(("a",), world_size=2, slot_rank0=0) is probes
    assert probes.get(key) is None
    probes.put(key, True)
    probes.settle(healthy=False)  # a rank failed in that cell: its peers may not have measured
    probes.begin(("a",), world_size=2, slot_rank0=0)
    assert probes.get(key) is None
    probes.put(key, True)
    probes.settle(healthy=True)
    probes.begin(("a",), world_size=2, slot_rank0=0)
    assert probes.get(key) is True and probes.hits == 1


@pytest.mark.parametrize("scope", [(("b",), 2, 0), (("a",), 2, 2), (("a",), 4, 0)])
def test_probe_answers_belong_to_their_patch_set_and_slot(scope):
    probes = ProbeCache()
    key = ("gloo", "cpu", (0, 1), "torch.float32")
    probes.begin(("a",), world_size=2, slot_rank0=0)
    probes.put(key, True)
    probes.settle(healthy=True)
    patches, world_size, slot_rank0 = scope
    probes.begin(patches, world_size=world_size, slot_rank0=slot_rank0)
    assert probes.get(key) is None


@pytest.mark.slow
def test_a_launch_probes_again_after_a_failed_cell_and_not_after_a_healthy_one(tmp_path):
    """fault_unexpected probes, then rank 1 fails in forward: the answer is dropped, so
    fault_after probes again; fault_nan_fsdp (a mismatch: every rank trained) finds fault_after's."""
    from harness.launch.launcher import LaunchOptions, run_cells
    from harness.plan.cells import plan_cells
    from harness.scenario.load import load_scenarios
    from tests.support import FIXTURE_SCENARIOS

    names = ["fault_unexpected", "fault_after", "fault_nan_fsdp"]
    scenarios = load_scenarios([str(FIXTURE_SCENARIOS)]).scenarios
    cells = plan_cells([scenarios[n] for n in names], world_sizes=[2], devices=["cpu"], variants=["vanilla"],
                       explicit_scenarios=True)
    cells.sort(key=lambda c: names.index(c.scenario))
    for i, c in enumerate(cells):  # the slot runs them in this order
        c.index = i
    opts = LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", scenario_dirs=[str(FIXTURE_SCENARIOS)]),
                         log_dir=tmp_path / "logs")
    records = run_cells(cells, opts).records
    assert [(r.scenario, r.status) for r in records] == list(zip(names, ["error", "pass", "mismatch"]))
    assert len({r.launch_id for r in records}) == 1
    probed = {r.scenario: "reduction probe" in (r.phases or {}) for r in records}
    assert probed == {"fault_unexpected": True, "fault_after": True, "fault_nan_fsdp": False}
