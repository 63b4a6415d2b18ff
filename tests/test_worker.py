"""The per-rank program (``harness.rank.worker``): which cells are this rank's, and that it
preloads and imports only what they need."""

import pytest

from harness.plan.cells import Cell
from harness.plan.placement import Stage
from harness.protocol import LaunchPlan
from harness.rank import worker


def _cell(index, **kw):
    base = dict(index=index, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=1, mesh=(1,),
                timeout_s=5.0)
    return Cell(**(base | kw))


def _plan(cells, stages):
    return LaunchPlan(run_id="r", launch_id="L1", device="cpu", world_size=4, patches_module="fsdp_patches",
                      patch_mapping={}, patches_module_id="", out_path="/dev/null", folder="/tmp", cells=cells,
                      stages=stages)


def test_a_rank_runs_its_slots_cells_in_every_stage():
    cells = [_cell(0, world_size=4, mesh=(4,)), _cell(1, world_size=2, mesh=(2,)), _cell(2, world_size=2, mesh=(2,)),
             _cell(3), _cell(4), _cell(5)]
    plan = _plan(cells, [Stage(world_size=4, slots=[[0]]), Stage(world_size=2, slots=[[1], [2]]),
                         Stage(world_size=1, slots=[[3], [], [4, 5]])])
    assert [[c.index for c in worker._cells_of(plan, r)] for r in range(4)] == [[0, 1, 3], [0, 1], [0, 2, 4, 5], [0, 2]]


@pytest.mark.parametrize("cells, wanted", [
    ([_cell(0), _cell(1, variant="patched", patches=("p",))], ["preload"]),
    ([_cell(0), _cell(1, expected=("crash",))], ["torch._dynamo"]),  # runs forked: import once, before the zygote
    ([_cell(0), _cell(1)], []),
])
def test_only_what_the_ranks_cells_need_is_preloaded(monkeypatch, cells, wanted):
    done = []
    monkeypatch.setattr(worker, "preload", lambda: done.append("preload"))
    monkeypatch.setattr(worker.importlib, "import_module", done.append)
    worker._preload(cells)
    assert done == wanted


def test_requirements_are_those_of_the_ranks_scenarios(monkeypatch):
    from harness.spec import Scenario
    from scenarios._models import MLP, randn_batch

    scenarios = {name: Scenario(name=name, model=MLP, batch=randn_batch(), requires=(f"pkg_{name}.models",))
                 for name in ("a", "b")}
    imported = []
    monkeypatch.setattr(worker.importlib, "import_module", imported.append)
    worker._import_requirements([_cell(0, scenario="a"), _cell(1, scenario="a")], scenarios)
    assert imported == ["pkg_a.models"]
