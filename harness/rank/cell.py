"""One cell on one rank of its slot: install its patch set, train, agree on the outcome, and (the slot's first
rank) judge it and write its record.

User code (patch import and install, group setup, model build, forward, backward) runs under the cell's deadline
(``harness.rank.watchdog``); the ranks agree on the outcome through the store (``harness.rank.peers``). A rank that
failed shuts its collective sockets, so a blocked peer fails at once; one that never reports has its stacks recorded.

Isolation (``RunConfig.isolate``, ``harness.plan.placement``): by default every CPU cell runs in a process
forked from the rank's zygote (``harness.rank.forked``), so it starts from the torch every cell starts from,
whatever the cells before it did; it trains, saves what FSDP2 produced and posts its outcome, and the
worker, which never runs scenario or patch code, judges. Where cells share the worker (cuda; ``--isolate
snapshot``), what torch and Python keep process-wide is taken before the cell and put back after it
(``harness.rank.state``, ``harness.rank.leaks``), and patch sets are undone in turn
(``harness.undertest.undo``). Either way, what the cell left changed goes on its record (``left_state``),
the torch functions its patch set replaced too (``patch_changes``), and the reference runs in a process of
its own (``harness.rank.judging``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from harness.plan.cells import Cell
from harness.plan.placement import runs_forked
from harness.protocol import CellKeys, LaunchPlan, install_phase, mark_started, read_phase
from harness.rank import peers
from harness.rank.deadlock import Slot
from harness.rank.groups import CellGroups, ProbeCache, keep_group
from harness.rank.judging import check_saved, dump, save_observed, scenario_for
from harness.rank.leaks import CellState, TorchAttributes
from harness.rank.phases import CLOCK, fold, read_totals
from harness.rank.registries import Registries
from harness.rank.skips import skip_fields
from harness.rank.state import GlobalState
from harness.rank.watchdog import CellTimeout, Watchdog, read_stacks
from harness.results import record
from harness.results.outcome import CellOutcome
from harness.scenario.spec import Scenario
from harness.undertest import code_ran
from harness.undertest.install import install_set, load_patches_module
from harness.undertest.source import Utilities
from harness.undertest.undo import PatchUndo, forget_module
from harness.vocabulary import Failure

__all__ = ["CellRun"]

#: how long past the deadline the judge waits for the slot's other ranks
_REPORT_GRACE_S = 2.0
#: how long past a cell's deadline the other ranks wait for the judge's record
_RECORDED_GRACE_S = 30.0


@dataclass(kw_only=True)
class CellRun:
    plan: LaunchPlan
    store: dist.Store
    watchdog: Watchdog
    scenarios: dict[str, Scenario]
    #: the patch set installed now, what it reported, the utilities it provides, and the torch
    #: functions and methods it replaced
    active: tuple[str, ...] = ()
    installs: dict[str, dict[str, str]] = field(default_factory=dict)
    utilities: Utilities = field(default_factory=Utilities)
    patch_changes: list[str] = field(default_factory=list)
    #: those attributes' values as the set installed them (put back if a cell changes them)
    installed: dict[str, Any] = field(default_factory=dict)
    undo: PatchUndo | None = None
    #: patch set -> the cell whose install of it hung (it is not retried)
    hung_sets: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: forks cell and reference processes (``harness.rank.forked.Zygote``); None: both run here
    zygote: Any = None
    #: this process was forked for one cell: it trains and posts its outcome, the worker judges
    forked: bool = False
    #: torch's functions, methods and classes before any cell (``harness.rank.leaks``): what a
    #: patch set or a cell changed is named against them, and in a shared process put back
    baseline: TorchAttributes = field(default_factory=TorchAttributes)
    #: a forked cell's process: the process-wide state it starts with, taken once by its zygote
    start: CellState | None = None
    #: the process-wide state from before the active patch set's import and install, put back
    #: with ``undo`` when the set changes (``harness.rank.state``)
    set_state: GlobalState | None = None
    #: torch's registries before the active patch set was installed (a set may register a
    #: DTensor sharding rule), put back with ``set_state``
    set_registries: Registries | None = None
    #: the phase clock at the cell's start (``harness.rank.phases``): the record's ``phases`` count from it
    mark: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the default group, kept between the slot's healthy cells (``harness.rank.groups``)
    groups: CellGroups = field(default_factory=CellGroups)
    #: the gloo AVG probe's answers, kept between the slot's healthy cells (``harness.rank.groups``)
    probes: ProbeCache = field(default_factory=ProbeCache)

    def run_cell(self, cell: Cell, *, slot_rank0: int, rank: int) -> bool:
        """Run ``cell`` as rank ``rank`` of its slot; False when the launch must end."""
        t0 = time.time()
        self.mark = CLOCK.snapshot()
        if rank == 0:
            mark_started(self.plan.progress_file, cell.index, list(range(slot_rank0, slot_rank0 + cell.world_size)))
        if runs_forked(cell, self.plan.config.isolate) and self.zygote is not None and cell.patches not in self.hung_sets:
            with CLOCK.timed("forked cell"):
                self.groups.release()  # every rank of the slot: the cell's processes make their own
                return self.zygote.run_cell(self, cell, slot_rank0=slot_rank0, rank=rank, t0=t0)
        return self.run_here(cell, slot_rank0=slot_rank0, rank=rank, t0=t0)

    def run_here(self, cell: Cell, *, slot_rank0: int, rank: int, t0: float) -> bool:
        """The cell itself, in this process."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        self.mark = self.mark or CLOCK.snapshot()  # a forked cell's process counts from here
        self.watchdog.arm(cell.timeout_s, Slot.of(self.plan, cell, slot_rank0, rank))  # a certain hang ends it at once
        observed, outcome = None, peers.RankOutcome(rank=rank, ok=True)
        before: CellState | None = None
        try:
            CLOCK.enter("patches")
            if self.forked:  # the patch set's own changes count as the cell's
                with CLOCK.timed("state"):
                    before = self.start or CellState.take()
            prepared = self._prepare(cell)
            outcome.prepared = prepared.to_json() if prepared is not None else None
            if prepared is None:
                if before is None:
                    with CLOCK.timed("state"):
                        before = CellState.take()
                observed = self._train(cell, keys, rank, slot_rank0)
        except BaseException as e:  # CellTimeout included: the cell ends, the launch goes on
            outcome = peers.failure(rank, e, self.watchdog)
        finally:
            CLOCK.enter("group teardown")
            outcome.group_seq = self.groups.after_cell(failed=not outcome.ok)
        if not outcome.ok:
            # gloo keeps a failed group's sockets open: a peer blocked in a collective on this
            # rank would wait for the timeout. Shutting them makes it fail at once.
            peers.shutdown_peer_sockets()
        CLOCK.enter("state")
        if before is not None:
            outcome.left_state = before.settle(put_back=not self.forked)
            # torch's functions and methods the cell's own code replaced (its patch set's are its set's)
            if self.forked:
                replaced = [n for n in self.baseline.changes(added=False) if n not in self.patch_changes] if rank == 0 else []
            else:
                replaced = self.baseline.restore(keep=self.installed)
            outcome.left_state += [f"left {name} replaced" for name in replaced]
        if rank == 0:
            outcome.patch_install = {n: self.installs[n] for n in cell.patches if n in self.installs}
            outcome.patch_changes = list(self.patch_changes)
            if observed is not None and outcome.ok:
                with CLOCK.timed("gather"):  # handed to the judge's referee
                    save_observed(self.plan.observed_file(cell.index), observed)
                outcome.observed = True
        CLOCK.enter("agree")
        outcome.code_ran = code_ran.report() if cell.patches else {}
        peers.post(self.store, keys, outcome, done=self.plan.slot_file(slot_rank0 + rank, "done"))
        if self.forked:  # the worker judges (``harness.rank.forked.Zygote.run_cell``)
            self.watchdog.disarm()
            return True
        if rank != 0:
            recorded = self.wait_recorded(cell, t0=t0)
            self._settle_groups(keys, recorded)
            self.watchdog.disarm()
            return recorded and not self.store.check([keys.abandoned])
        missing = self.judge(cell, t0=t0, slot_rank0=slot_rank0)
        self._settle_groups(keys, True)
        self.watchdog.disarm()
        return not missing

    def _settle_groups(self, keys: CellKeys, recorded: bool) -> None:
        """Keep the default group, and the probe answers the cell measured, for the next cell only where the judge said so."""

        def judge_said(key: str) -> bool:
            return recorded and self.store.check([key]) and self.store.get(key) == b"1"

        with CLOCK.timed("group teardown"):
            self.groups.settle(keep=judge_said(keys.keep_group))
            self.probes.settle(healthy=judge_said(keys.healthy))

    def wait_recorded(self, cell: Cell, *, t0: float) -> bool:
        """A rank other than the judge: wait (bounded) until the judge has written the cell's record."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        return peers.wait(self.store, [keys.recorded], t0 + 2 * cell.timeout_s + _RECORDED_GRACE_S - time.time())

    def judge(self, cell: Cell, *, t0: float, slot_rank0: int, forked: bool = False) -> list[int]:
        """The slot's first rank: collect every rank's outcome, judge, write the record
        (``forked``: the cell ran in a process of its own, whose phases the record shows).
        Returns the ranks that never reported."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        deadline = t0 + cell.timeout_s + _REPORT_GRACE_S
        CLOCK.enter("agree")
        outcomes, missing = peers.collect_outcomes(self.store, keys, cell.world_size, max(1.0, deadline - time.time()))
        if missing:  # a rank is stuck where the watchdog cannot reach: this launch must end
            self.store.set(keys.abandoned, "0")
        mine = next((o for o in outcomes if o.rank == 0), peers.RankOutcome(rank=0, ok=False))
        if missing or not all(o.ok for o in outcomes):
            phases = {r: read_phase(self.plan.stamp_file(slot_rank0 + r)) for r in missing}
            outcome = peers.blame(outcomes, phases, cell.timeout_s)
            outcome.traceback = read_stacks({r: self.plan.stamp_file(slot_rank0 + r) for r in missing}) or outcome.traceback
        else:
            outcome = CellOutcome.from_json(mine.prepared) if mine.prepared else self._verdict(cell, mine)
        left = [*mine.left_state, *(f"{c} (rank {o.rank})" for o in outcomes if o.rank != 0 for c in o.left_state
                                    if c not in mine.left_state)]
        CLOCK.enter("record")
        phases = CLOCK.since(self.mark)
        if forked:
            phases = fold(phases, "forked cell", read_totals(self.plan.phase_times_file(slot_rank0, cell=cell.index)))
        phases = fold(phases, "reference", read_totals(self.plan.phase_times_file(slot_rank0, cell.index, "reference")))
        ran = [o.code_ran for o in outcomes] + [code_ran.report() if cell.patches and not forked else {}]  # in-process reference
        outcome.update(patch_install=mine.patch_install, patch_changes=mine.patch_changes, phases=phases,
                       left_state=list(dict.fromkeys(left)), code_deps=code_ran.merge(ran) if cell.patches else None)
        rec = record.new_record(cell, outcome, run_id=self.plan.run_id, launch_id=self.plan.launch_id,
                                patches_module=self.plan.config.patches, patches_module_id=self.plan.patches_module_id,
                                t0=t0, order_seed=self.plan.config.shuffle)
        record.append(self.plan.out_path, record.finish(rec, t0))
        self.store.set(keys.keep_group, "1" if keep_group(outcomes, missing) else "0")
        self.store.set(keys.healthy, "1" if not missing and all(o.ok for o in outcomes) else "0")
        self.store.set(keys.recorded, "1")
        return missing

    def _verdict(self, cell: Cell, mine: peers.RankOutcome) -> CellOutcome:
        """The reference and the comparison, in a process of their own where one can be forked."""
        path = self.plan.observed_file(cell.index)
        if not mine.observed or not path.exists():
            return CellOutcome(status="error", exc_type=Failure.HARNESS_ERROR, exc_msg="the judging rank saved no snapshots")
        if self.plan.config.dump:
            dump(self.plan.config.dump, cell, path)
        with CLOCK.timed("reference"):
            if self.zygote is not None:
                return self.zygote.reference(self.plan, cell, mine.patch_install, time.time() + cell.timeout_s)
            return check_saved(self.scenarios, cell, path, mine.patch_install)  # no fork here: under the patch set

    # -- steps ------------------------------------------------------------------------
    def _prepare(self, cell: Cell) -> CellOutcome | None:
        """Install the cell's patch set; the outcome of a cell that needs no training, or None."""
        if cell.patches in self.hung_sets:
            return CellOutcome(status="hang", exc_type=Failure.CELL_TIMEOUT, exc_msg=f"not run: installing this patch set hung in "
                        f"cell {self.hung_sets[cell.patches]} of this launch")
        try:
            self._activate(cell.patches)
        except CellTimeout:
            self.hung_sets[cell.patches] = cell.index
            raise
        errors = [f"patch install error: {n}: {self.installs[n]['reason']}" for n in cell.patches
                  if self.installs.get(n, {}).get("status") == "error"]
        if errors:
            return CellOutcome(status="error", exc_type=Failure.PATCH_INSTALL_ERROR, exc_msg=errors[0])
        missing = [n for n in cell.scenario_patches if n in cell.patches
                   and self.installs.get(n, {}).get("status") == "not-provided"]
        if missing and cell.variant in ("patched", "api"):  # it would run as vanilla, to no purpose
            return CellOutcome(status="skip", reason=f"not provided by the module under test: {', '.join(missing)}")
        return skip_fields(cell, self.scenarios[cell.scenario])

    def _activate(self, names: tuple[str, ...]) -> None:
        """Install a patch set; in a shared process, switching sets first undoes the previous
        one (``harness.undertest.undo``)."""
        if names == self.active:
            return
        if not self.forked:
            # the undo puts back every attribute of torch.distributed's modules and classes as the
            # snapshot saw them (GroupMember.WORLD, the group counter): no group may outlive it;
            # every function, method and class of torch goes back to what it was before any cell
            self.groups.release()
            if self.undo is not None:
                self.undo.restore()
            self.baseline.restore()
            if self.set_state is not None:
                self.set_state.restore()
            if self.set_registries is not None:
                self.set_registries.restore()
        self.undo, self.set_state, self.set_registries = None, None, None
        self.active, self.installs, self.utilities = names, {}, Utilities()
        self.patch_changes, self.installed = [], {}
        code_ran.begin()  # a cell then depends on all its set ran in this process so far (state carries over)
        if not names:
            return
        if not self.forked:
            self.set_state, self.set_registries = GlobalState.take(), Registries.take()
            self.undo = PatchUndo.take()
            forget_module(self.plan.config.patches)
        try:
            with self.watchdog.user_code("import patches"):
                module = load_patches_module(self.plan.config.patches)
        except ValueError as e:
            self.installs = {n: {"status": "error", "reason": str(e)} for n in names}
            return
        with self.watchdog.user_code("install patches"):
            self.installs, self.utilities = install_set(module, list(names), self.plan.config.patch_mapping,
                                                        label=self.plan.config.patches,
                                                        on_patch=lambda n: self.watchdog.stamp(install_phase(n)))
        self.patch_changes = self.baseline.changes()
        self.installed = self.baseline.current(self.patch_changes)

    def _train(self, cell: Cell, keys: CellKeys, rank: int, slot_rank0: int) -> list:
        from harness.train import fsdp as fsdp_run

        scenario = scenario_for(self.scenarios, cell)
        with self.watchdog.user_code("init group"):
            self.groups.open(cell, slot_rank0=slot_rank0, rank=rank, store=dist.PrefixStore(keys.group, self.store))
            probes = self.probes.begin(self.active, world_size=cell.world_size, slot_rank0=slot_rank0)
            return fsdp_run.train(scenario, cell, self.utilities, rank, cell.world_size, stamp=self.watchdog.stamp,
                                  probes=probes, timed=CLOCK.timed)
