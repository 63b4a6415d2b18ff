"""harness.rank.groups: the default group is kept only between healthy cells that made no
other group, and never across a change of patch set."""

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from harness.rank.cell import CellRun
from harness.rank.groups import CellGroups, keep_group
from harness.rank.peers import RankOutcome
from harness.rank.watchdog import Watchdog

CELL = SimpleNamespace(backend="gloo", world_size=1, timeout_s=30)


@pytest.fixture
def groups(tmp_path):
    made = CellGroups()
    n = iter(range(100))
    yield made, lambda: dist.FileStore(str(tmp_path / f"store{next(n)}"), 1)
    made.release()


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


def test_a_change_of_patch_set_releases_the_group_before_its_snapshot_and_undo(groups):
    """The undo puts back torch.distributed's module state as its snapshot saw it, the group
    counter included: a group kept across it would share its name with the next group made,
    and destroying that one would unregister it ("Could not resolve the process group
    registered under the name 0", measured before the fix)."""
    g, store = groups
    run = CellRun(plan=SimpleNamespace(patches_module="fsdp_patches", patch_mapping={}), store=None,
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
