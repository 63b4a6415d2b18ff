"""The per-rank program that torchrun starts: runs a launch's cells, stage by stage.

A stage holds the cells of one world size; this rank runs the cells of its slot
(``harness.plan.placement``) on a process group of the slot's ranks, while the other slots
run theirs side by side, and all ranks meet at the end of the stage. Each cell gets its
own model and optimizer, and a default process group (``PrefixStore`` over torchrun's
store) made for it or kept from the slot's previous cell where every rank of that one
succeeded in step (``harness.rank.groups``); the slot's ranks agree on its outcome through
the store (``harness.rank.peers``), not through the process group, so a cell that broke
its group cannot break the next.

Every step of user code runs under the cell's deadline (``harness.rank.watchdog``). The
slot's first rank judges the cell (reference + comparison) and appends its record
before the slot's next cell starts. A cell that cannot be closed cleanly (a rank never
reports) ends the launch with exit code 3; the launcher relaunches for the rest.

Usage (by the launcher): ``torchrun ... -m harness.rank.worker --plan PLAN.json``
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import sys
from collections.abc import Iterable

import torch

from harness.plan.cells import Cell
from harness.process import collector
from harness.process.cpus import pin_rank
from harness.process.tree import die_with_parent
from harness.protocol import LaunchPlan, stage_done
from harness.rank import peers
from harness.rank.cell import CellRun
from harness.rank.forked import Zygote
from harness.rank.leaks import TorchAttributes
from harness.rank.phases import CLOCK, process_age
from harness.rank.watchdog import Watchdog, note_exits
from harness.scenario.load import load_scenarios
from harness.undertest import code_ran
from harness.undertest.install import module_root
from harness.undertest.source import is_path
from harness.undertest.undo import preload
from harness.vocabulary import installs_patches

__all__ = ["import_requirements", "main", "pin", "precompile_patches", "selected_requirements", "warm_up"]

EXIT_POISONED = 3
#: the harness's own exits (``os._exit`` itself is wrapped by ``note_exits``)
_hard_exit = os._exit


def main(argv: list[str] | None = None) -> None:
    CLOCK.reset("scenarios")
    CLOCK.add("startup", *process_age())
    die_with_parent()
    parser = argparse.ArgumentParser(prog="harness.rank.worker")
    parser.add_argument("--plan", required=True)
    plan = LaunchPlan.load(parser.parse_args(argv).plan)
    pin(plan)  # before any thread starts: they inherit it
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # tells the launcher at once which rank a fatal signal killed
    faulthandler.enable(file=open(plan.crash_file(rank), "w"))  # noqa: SIM115 (kept open for the process)
    scenarios = _WARM.get("scenarios") or warm_up(plan, _cells_of(plan, rank))
    baseline = TorchAttributes.take()  # torch as every cell starts with it (``harness.rank.leaks``)
    CLOCK.enter("rendezvous")
    # before any cell, thread or store connection: forked cells and every reference run in its forks
    zygote = Zygote.start(plan, scenarios, baseline)
    if plan.device == "cuda":
        # only now, in the worker: CUDA initialized before the fork would leave the zygote's
        # children (every reference, on the cell's device) unable to use it
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    store = peers.connect_store(world)
    watchdog = Watchdog(plan.stamp_file(rank), on_expire=peers.unblock)
    note_exits(watchdog, plan.exit_file(rank))  # a patch that calls os._exit: the launcher names rank, code, phase
    run = CellRun(plan=plan, store=store, watchdog=watchdog, scenarios=scenarios, zygote=zygote, baseline=baseline)
    CLOCK.enter("other")
    for n, stage in enumerate(plan.stages):
        slot, local = divmod(rank, stage.world_size)
        for index in stage.cells_of(slot):
            if not run.run_cell(plan.cell(index), slot_rank0=slot * stage.world_size, rank=local):
                _exit(EXIT_POISONED, plan, rank)
            with CLOCK.timed("other"):
                collector.refreeze()  # what the cells left for good, out of the collector's walks
        with CLOCK.timed("group teardown"):
            run.groups.release()  # kept only within a slot's run of cells
        with CLOCK.timed("stage wait"):
            store.set(stage_done(plan.launch_id, n, rank), "done")
            peers.wait(store, [stage_done(plan.launch_id, n, r) for r in range(world)], 24 * 3600)
        CLOCK.write(plan.phase_times_file(rank), launch=plan.launch_id, rank=rank)
    _exit(0, plan, rank)  # avoids the frequent abort at interpreter exit after destroy_process_group()


def warm_up(plan: LaunchPlan, cells: list[Cell], loaded: tuple | None = None) -> dict:
    """Load the scenarios and import what ``cells`` need before their deadlines run; returns the
    scenarios. A forkserver (``harness.launch.forkserver``) does it once for every cell of the launch;
    ``loaded``: (folders, library) it loaded before the plan came, used where the folders match."""
    same = loaded is not None and list(loaded[0]) == [str(d) for d in plan.config.scenario_dirs]
    scenarios = (loaded[1] if same else load_scenarios(plan.config.scenario_dirs)).scenarios
    CLOCK.enter("preload")
    installing = _preload(plan, cells)
    import_requirements(selected_requirements(scenarios, plan.config.scenarios))
    precompile_patches(installing, plan.config.patches)
    # torch's, transformers' and the harness's objects live as long as the rank: left
    # in the collector's view, every full collection walks them again (a cell that
    # collects per step, ``harness.train.resources``: 0.3-0.5 s each, tens of ms frozen)
    collector.freeze()
    collector.settle()  # a server paused it for these imports (harness.process.collector)
    _WARM["scenarios"] = scenarios
    return scenarios


#: what ``warm_up`` returned in this process (a forked worker does not warm up again)
_WARM: dict = {}


def pin(plan: LaunchPlan) -> int | None:
    """This rank's core (``harness.process.cpus.pin_rank``) unless the run says ``--no-pin``."""
    if not plan.config.pin_ranks:
        return None
    return pin_rank(int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _cells_of(plan: LaunchPlan, rank: int) -> list[Cell]:
    """The cells this rank runs: its slot's, in every stage."""
    by_index = {c.index: c for c in plan.cells}
    return [by_index[i] for stage in plan.stages for i in stage.cells_of(rank // stage.world_size)]


def _preload(plan: LaunchPlan, cells: list[Cell]) -> bool:
    """What the rank's cells need before their deadlines: every module a patch may touch where
    the run may install patches (``installs_patches``: whichever of the run's cells the launch
    runs, so that a rank of an incremental run starts as a fresh run's does) or a cell does
    (``harness.undertest.undo.preload``); else the dynamo package FSDP2 imports on first use
    (importing it sets up torch, ``torch.manual_seed`` included: before the rank's snapshot of
    torch, ``harness.rank.leaks``, and once, not in every forked process). Whether it preloaded."""
    installing = installs_patches(plan.config.variants, plan.config.init) or any(c.patches for c in cells)
    if installing:
        preload()
    else:
        importlib.import_module("torch._dynamo")
    return installing


def precompile_patches(installing: bool, patches: str) -> None:
    """The module under test's probed code, compiled, not run (``harness.undertest.code_ran.precompile``),
    where patches may be installed; after every import, so its scan of the imported modules is complete."""
    if installing and (is_path(patches) or "." not in patches):  # finding a.b would import a
        with contextlib.suppress(ValueError):
            root = module_root(patches)
            if root is not None:
                code_ran.precompile(root)


def selected_requirements(scenarios: dict, names: list[str] | None) -> list[str]:
    """The modules the run's scenarios need (``Scenario.requires``): of every scenario it selected
    (``names``; none: all), not only of the cells a launch runs, so that a rank starts the same
    in an incremental run (a few cells) as in a fresh one (the hf_ pack's transformers imported
    by any launch of a run that has the pack); an unknown name has none."""
    return [m for n in (names or scenarios) if n in scenarios for m in scenarios[n].requires]


def import_requirements(names: Iterable[str]) -> list[str]:
    """Import each of ``names`` once; those that failed (a missing package: its cells are
    skipped with the reason)."""
    failed = []
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    return failed


def _exit(code: int, plan: LaunchPlan | None = None, rank: int = 0) -> None:
    if plan is not None:
        CLOCK.write(plan.phase_times_file(rank), launch=plan.launch_id, rank=rank)
    sys.stdout.flush()
    sys.stderr.flush()
    _hard_exit(code)


if __name__ == "__main__":
    main()
