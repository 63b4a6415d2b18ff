"""The per-rank program (``harness.rank.worker``): which cells are this rank's, that it
preloads only what they need, and imports what the run's scenarios need."""

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

from harness.plan.cells import Cell
from harness.plan.placement import Stage
from harness.protocol import LaunchPlan
from harness.rank import worker
from harness.runconfig import RunConfig
from tests.support import ROOT


def _cell(index, **kw):
    base = dict(index=index, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=1, mesh=(1,),
                timeout_s=5.0)
    return Cell(**(base | kw))


def _plan(cells, stages, config=None):
    return LaunchPlan(run_id="r", launch_id="L1", device="cpu", world_size=4, config=config or RunConfig(),
                      patches_module_id="", out_path="/dev/null", folder="/tmp", cells=cells, stages=stages)


def test_a_rank_runs_its_slots_cells_in_every_stage():
    cells = [_cell(0, world_size=4, mesh=(4,)), _cell(1, world_size=2, mesh=(2,)), _cell(2, world_size=2, mesh=(2,)),
             _cell(3), _cell(4), _cell(5)]
    plan = _plan(cells, [Stage(world_size=4, slots=[[0]]), Stage(world_size=2, slots=[[1], [2]]),
                         Stage(world_size=1, slots=[[3], [], [4, 5]])])
    assert [[c.index for c in worker._cells_of(plan, r)] for r in range(4)] == [[0, 1, 3], [0, 1], [0, 2, 4, 5], [0, 2]]


@pytest.mark.parametrize("args, pinned", [([], True), (["--no-pin"], False)])
def test_a_rank_is_pinned_to_its_core_unless_the_run_says_no_pin(monkeypatch, tmp_path, args, pinned):
    from harness.cli import _parser
    from harness.runconfig import from_namespace

    calls = []
    monkeypatch.setattr(worker, "pin_rank", lambda local_rank, local_world: calls.append((local_rank, local_world)) or 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    plan = _plan([], [], config=from_namespace(_parser().parse_args(["run", *args])))
    plan = LaunchPlan.load(dataclasses.replace(plan, folder=str(tmp_path)).dump())  # as the rank reads it
    assert worker.pin(plan) == (1 if pinned else None)
    assert calls == ([(3, 4)] if pinned else [])


@pytest.mark.parametrize("variants, init, cells, wanted", [
    (["vanilla", "patched"], "full", [_cell(0)], ["preload", "precompile fsdp_patches"]),  # the run may install
    (["vanilla"], "full", [_cell(0), _cell(1, variant="patched", patches=("p",))], ["preload", "precompile fsdp_patches"]),
    (["vanilla"], "meta", [_cell(0)], ["preload", "precompile fsdp_patches"]),  # every variant installs the workaround
    (["vanilla", "api"], "full", [_cell(0), _cell(1, expected=("crash",))], ["torch._dynamo"]),  # before the snapshot
])
def test_what_a_run_that_may_install_patches_needs_is_preloaded(monkeypatch, variants, init, cells, wanted):
    """Decided by the run, not by the cells of the launch: an incremental run's ranks start as a fresh run's."""
    done = []
    monkeypatch.setattr(worker, "preload", lambda: done.append("preload"))
    monkeypatch.setattr(worker.importlib, "import_module", done.append)
    monkeypatch.setattr(worker.code_ran, "precompile", lambda root: done.append(f"precompile {root.name}"))
    plan = _plan(cells, [], config=RunConfig(variants=variants, init=init))
    worker.precompile_patches(worker._preload(plan, cells), "fsdp_patches")  # compiled, never run
    assert done == wanted


def test_requirements_are_those_of_every_scenario_the_run_selected(monkeypatch):
    """Not only those of the launch's cells: an incremental run's ranks start as a fresh run's do."""
    from harness.spec import Scenario
    from scenarios._models import MLP, randn_batch

    scenarios = {name: Scenario(name=name, model=MLP, batch=randn_batch(), requires=(f"pkg_{name}.models",))
                 for name in ("a", "b", "c")}
    assert worker.selected_requirements(scenarios, ["a", "c", "gone"]) == ["pkg_a.models", "pkg_c.models"]
    assert worker.selected_requirements(scenarios, []) == ["pkg_a.models", "pkg_b.models", "pkg_c.models"]
    imported = []
    monkeypatch.setattr(worker.importlib, "import_module", imported.append)
    worker.import_requirements(["pkg_a.models", "pkg_c.models", "pkg_a.models"])
    assert imported == ["pkg_a.models", "pkg_c.models"]
    imported.clear()
    monkeypatch.setattr(worker, "_preload", lambda plan, cells: False)
    monkeypatch.setattr(worker, "precompile_patches", lambda installing, patches: None)
    monkeypatch.setattr(worker.collector, "freeze", lambda: None)
    monkeypatch.setitem(worker._WARM, "scenarios", None)
    config = types.SimpleNamespace(scenario_dirs=[], scenarios=["b", "c"], patches="fsdp_patches")
    worker.warm_up(types.SimpleNamespace(config=config), [_cell(0, scenario="b")],
                   loaded=([], types.SimpleNamespace(scenarios=scenarios)))
    assert imported == ["pkg_b.models", "pkg_c.models"]  # c has no cell in this launch


_SEES = '''
import gc, os
from harness.spec import Scenario, default_forward
from scenarios._models import MLP, randn_batch

def _forward(model, batch, ctx):
    cores = len(os.sched_getaffinity(0))
    expected = os.environ["SEES_CORES"]
    if str(cores) != expected or (gc.get_freeze_count() > 0) != (os.environ["SEES_FROZEN"] == "1"):
        raise RuntimeError(f"rank {ctx.rank} sees {cores} core(s), {gc.get_freeze_count()} frozen objects")
    return default_forward(model, batch, ctx)

SCENARIOS = [Scenario(name="sees", summary="checks its rank's cores and collector", model=MLP, batch=randn_batch(),
                      forward=_forward, world_sizes=(4,), devices=("cpu",))]
'''


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs affinity control and two cores")
def test_four_ranks_on_two_cores_run_pinned_with_startup_objects_frozen(tmp_path):
    """Ranks that outnumber the cores run on one core each; what they imported is frozen."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "sees.py").write_text(_SEES)
    two = sorted(os.sched_getaffinity(0))[:2]
    env = {**os.environ, "SEES_CORES": "1", "SEES_FROZEN": "1"}
    cmd = ["taskset", "-c", ",".join(map(str, two)), sys.executable, "-m", "harness", "run", "--scenarios-dir",
           str(tmp_path / "cases"), "--scenario", "sees", "--variant", "vanilla", "--out", str(tmp_path / "r.jsonl")]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(r["scenario"], r["status"]) for r in records] == [("sees", "pass")], records[0].get("exc_msg")
    assert out.returncode == 0, out.stderr[-2000:]
