"""One cell on one rank of its slot: install its patch set, train, agree on the outcome,
and (the slot's first rank) judge it and write its record.

Every step of user code runs under the cell's deadline (``harness.rank.watchdog``): the
patches module's import and install, process-group setup, model build, forward and
backward, and the reference. The ranks agree on the outcome through the store
(``harness.rank.peers``). A rank that failed shuts its collective sockets at once, so a peer
blocked in a collective on it fails at once instead of at the timeout.

Cells share the process: what torch and Python keep process-wide (default dtype,
deterministic algorithms, ``os.environ``, RNG states, ...) is taken before the cell trains
and put back after it (``harness.rank.state``); what the cell left changed goes on its
record as ``left_state``, shown as a caveat in the report.
"""

from __future__ import annotations

import importlib.util
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness.plan.cells import Cell
from harness.plan.placement import runs_forked
from harness.protocol import CellKeys, LaunchPlan, install_phase, mark_started, read_phase
from harness.rank import peers
from harness.rank.groups import CellGroups, ProbeCache, keep_group
from harness.rank.judging import ReferenceCache
from harness.rank.judging import dump as _dump
from harness.rank.judging import judge as _judge
from harness.rank.phases import CLOCK
from harness.rank.state import GlobalState
from harness.rank.watchdog import CellTimeout, Watchdog
from harness.results import record
from harness.scenario.spec import UNUSED_PARAMS_API, Scenario
from harness.train.meta_init import as_meta, init_gap
from harness.train.step import StepTensors
from harness.undertest.install import install_set, load_patches_module
from harness.undertest.undo import PatchUndo, forget_module

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
    #: the patch set installed now, what it reported, and the utilities it provides
    active: tuple[str, ...] = ()
    installs: dict[str, dict[str, str]] = field(default_factory=dict)
    utilities: dict[str, Any] = field(default_factory=dict)
    undo: PatchUndo | None = None
    #: patch set -> the cell whose install of it hung (it is not retried)
    hung_sets: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: forks the processes of cells that may abort (``harness.rank.forked.Zygote``); None: run them here
    zygote: Any = None
    #: the process-wide state from before the active patch set's import and install, put back
    #: with ``undo`` when the set changes (``harness.rank.state``)
    set_state: GlobalState | None = None
    #: the phase clock at the cell's start (``harness.rank.phases``): the record's ``phases`` count from it
    mark: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: references computed here, shared by the cells that need the same (``harness.rank.judging``)
    references: ReferenceCache = field(default_factory=ReferenceCache)
    #: the default group, kept between the slot's healthy cells (``harness.rank.groups``)
    groups: CellGroups = field(default_factory=CellGroups)
    #: the gloo AVG probe's answers, kept between the slot's healthy cells (``harness.rank.groups``)
    probes: ProbeCache = field(default_factory=ProbeCache)

    def run_cell(self, cell: Cell, *, slot_rank0: int, rank: int) -> bool:
        """Run ``cell`` as rank ``rank`` of its slot; False when the launch must end.

        A cell that may abort the process (a documented crash or hang) runs in a forked
        process per rank on CPU (``harness.rank.forked``), so an abort costs the cell, not the launch."""
        t0 = time.time()
        self.mark = CLOCK.snapshot()
        if rank == 0:
            mark_started(self.plan.progress_file, cell.index, list(range(slot_rank0, slot_rank0 + cell.world_size)))
        if runs_forked(cell) and self.zygote is not None:
            with CLOCK.timed("forked cell"):
                self.groups.release()  # every rank of the slot: the cell's processes make their own
                return self.zygote.run_cell(self, cell, slot_rank0=slot_rank0, rank=rank, t0=t0)
        return self.run_here(cell, slot_rank0=slot_rank0, rank=rank, t0=t0)

    def run_here(self, cell: Cell, *, slot_rank0: int, rank: int, t0: float) -> bool:
        """The cell itself, in this process."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        self.mark = self.mark or CLOCK.snapshot()  # a forked cell's process counts from here
        self.watchdog.arm(cell.timeout_s)
        observed, outcome, fields = None, peers.RankOutcome(rank=rank, ok=True), {}
        before: GlobalState | None = None  # put back after the cell; what it left changed is a caveat
        try:
            CLOCK.enter("patches")
            fields = self._prepare(cell)
            if not fields:
                with CLOCK.timed("state"):
                    before = GlobalState.take()
                observed = self._train(cell, keys, rank, slot_rank0)
        except BaseException as e:  # CellTimeout included: the cell ends, the launch goes on
            outcome = _failure(rank, e, self.watchdog)
        finally:
            CLOCK.enter("group teardown")
            outcome.group_seq = self.groups.after_cell(failed=not outcome.ok)
        if not outcome.ok:
            # gloo keeps a failed group's sockets open: a peer blocked in a collective on this
            # rank would wait for the timeout. Shutting them makes it fail at once.
            peers.shutdown_peer_sockets()
        if rank != 0 and before is not None:  # the judge puts it back after the reference
            with CLOCK.timed("state"):
                outcome.left_state = before.restore()
        CLOCK.enter("agree")
        peers.post(self.store, keys, outcome)
        if rank != 0:
            recorded = self.wait_recorded(cell, t0=t0)
            self._settle_groups(keys, recorded)
            self.watchdog.disarm()
            return recorded and not self.store.check([keys.abandoned])
        missing = self.judge(cell, t0=t0, observed=observed, fields=fields, slot_rank0=slot_rank0, before=before)
        self._settle_groups(keys, True)
        self.watchdog.disarm()
        return not missing

    def _settle_groups(self, keys: CellKeys, recorded: bool) -> None:
        """Keep the default group, and the probe answers the cell measured, for the slot's next
        cell only where the judge said so."""

        def judge_said(key: str) -> bool:
            return recorded and self.store.check([key]) and self.store.get(key) == b"1"

        with CLOCK.timed("group teardown"):
            self.groups.settle(keep=judge_said(keys.keep_group))
            self.probes.settle(healthy=judge_said(keys.healthy))

    def wait_recorded(self, cell: Cell, *, t0: float) -> bool:
        """A rank other than the judge: wait (bounded) until the judge has written the cell's record."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        return peers.wait(self.store, [keys.recorded], t0 + cell.timeout_s + _RECORDED_GRACE_S - time.time())

    def judge(self, cell: Cell, *, t0: float, observed: list[StepTensors] | None, fields: dict[str, Any],
              slot_rank0: int, before: GlobalState | None = None) -> list[int]:
        """The slot's first rank: collect every rank's outcome, judge, write the record.
        ``before``: the process-wide state from before the cell, put back once the reference
        ran. Returns the ranks that never reported."""
        keys = CellKeys(launch_id=self.plan.launch_id, index=cell.index)
        deadline = t0 + cell.timeout_s + _REPORT_GRACE_S
        CLOCK.enter("agree")
        outcomes, missing = peers.collect_outcomes(self.store, keys, cell.world_size, max(1.0, deadline - time.time()))
        if missing:  # a rank is stuck where the watchdog cannot reach: this launch must end
            self.store.set(keys.abandoned, "0")
        fields = fields or self._outcome_fields(cell, observed, outcomes, missing, slot_rank0)
        CLOCK.enter("state")
        left = before.restore() if before is not None else []
        left += [f"{c} (rank {o.rank})" for o in outcomes for c in o.left_state if c not in left]
        CLOCK.enter("record")
        rec = record.new_record(cell, run_id=self.plan.run_id, launch_id=self.plan.launch_id,
                                patches_module=self.plan.patches_module,
                                patches_module_id=self.plan.patches_module_id, t0=t0, order_seed=self.plan.shuffle,
                                patch_install={n: self.installs[n] for n in cell.patches if n in self.installs},
                                left_state=list(dict.fromkeys(left)), phases=CLOCK.since(self.mark), **fields)
        record.append(self.plan.out_path, record.finish(rec, t0))
        self.store.set(keys.keep_group, "1" if keep_group(outcomes, missing) else "0")
        self.store.set(keys.healthy, "1" if not missing and all(o.ok for o in outcomes) else "0")
        self.store.set(keys.recorded, "1")
        return missing

    # -- steps ------------------------------------------------------------------------
    def _prepare(self, cell: Cell) -> dict[str, Any]:
        """Install the cell's patch set; fields of a record that needs no training, or {}."""
        if cell.patches in self.hung_sets:
            return dict(status="hang", exc_type="CellTimeout", exc_msg=f"not run: installing this patch set hung in "
                        f"cell {self.hung_sets[cell.patches]} of this launch")
        try:
            self._activate(cell.patches)
        except CellTimeout:
            self.hung_sets[cell.patches] = cell.index
            raise
        errors = [f"patch install error: {n}: {self.installs[n]['reason']}" for n in cell.patches
                  if self.installs.get(n, {}).get("status") == "error"]
        if errors:
            return dict(status="error", exc_type="PatchInstallError", exc_msg=errors[0])
        missing = [n for n in cell.scenario_patches if n in cell.patches
                   and self.installs.get(n, {}).get("status") == "not-provided"]
        if missing and cell.variant in ("patched", "api"):  # it would run as vanilla, to no purpose
            return dict(status="skip", reason=f"not provided by the module under test: {', '.join(missing)}")
        skip = _skip_reason(cell, self.scenarios[cell.scenario])
        return dict(status="skip", reason=skip) if skip else {}

    def _activate(self, names: tuple[str, ...]) -> None:
        """Install a patch set; switching sets first undoes the previous one (``harness.undertest.undo``)."""
        if names == self.active:
            return
        # the undo puts back every attribute of torch.distributed's modules and classes as the
        # snapshot saw them (GroupMember.WORLD, the group counter): no group may outlive it
        self.groups.release()
        if self.undo is not None:
            self.undo.restore()
        if self.set_state is not None:
            self.set_state.restore()
        self.undo, self.set_state, self.active, self.installs, self.utilities = None, None, names, {}, {}
        if not names:
            return
        self.set_state = GlobalState.take()
        self.undo = PatchUndo.take()
        forget_module(self.plan.patches_module)
        try:
            with self.watchdog.user_code("import patches"):
                module = load_patches_module(self.plan.patches_module)
        except ValueError as e:
            self.installs = {n: {"status": "error", "reason": str(e)} for n in names}
            return
        with self.watchdog.user_code("install patches"):
            self.installs, self.utilities = install_set(module, list(names), self.plan.patch_mapping,
                                                        label=self.plan.patches_module,
                                                        on_patch=lambda n: self.watchdog.stamp(install_phase(n)))

    def _train(self, cell: Cell, keys: CellKeys, rank: int, slot_rank0: int) -> list[StepTensors]:
        from harness.train import fsdp as fsdp_run

        scenario = self._scenario(cell)
        with self.watchdog.user_code("init group"):
            self.groups.open(cell, slot_rank0=slot_rank0, rank=rank, store=dist.PrefixStore(keys.group, self.store))
            probes = self.probes.begin(self.active, world_size=cell.world_size, slot_rank0=slot_rank0)
            return fsdp_run.train(scenario, cell, self.utilities, rank, cell.world_size, stamp=self.watchdog.stamp,
                                  probes=probes)

    def _scenario(self, cell: Cell) -> Scenario:
        scenario = self.scenarios[cell.scenario]
        scenario = as_meta(scenario) if cell.init == "meta" else scenario
        return scenario.with_api() if cell.variant == "api" else scenario

    def _outcome_fields(self, cell: Cell, observed: list[StepTensors] | None, outcomes: list[peers.RankOutcome],
                        missing: list[int], slot_rank0: int) -> dict[str, Any]:
        if missing or not all(o.ok for o in outcomes):
            phases = {r: read_phase(self.plan.phase_file(slot_rank0 + r)) for r in missing}
            return peers.blame(outcomes, phases, cell.timeout_s)
        assert observed is not None
        if self.plan.dump_dir:
            _dump(self.plan.dump_dir, cell, observed)
        try:
            with self.watchdog.user_code("reference"):
                # a set that changed what the reference computes with (torch.optim, ...) gets its own
                own = self.undo is not None and self.undo.changed_modules(ignore="torch.distributed")
                return _judge(self._scenario(cell), observed, cell, self.references, self.active if own else ())
        except BaseException as e:  # a broken or hung reference must not lose the cell
            timed_out = isinstance(e, CellTimeout)
            return dict(status="hang" if timed_out else "error", exc_type=type(e).__name__,
                        exc_msg=f"reference/compare {'timed out' if timed_out else 'failed'}: {e}"[:500],
                        traceback=traceback.format_exc()[-8000:])


def _failure(rank: int, e: BaseException, watchdog: Watchdog) -> peers.RankOutcome:
    lines = str(e).strip().splitlines()
    msg, fired = lines[0][:500] if lines else "", watchdog.fired
    if isinstance(e, CellTimeout):
        msg = f"the cell's deadline passed in {watchdog.phase!r}"
    elif isinstance(e, SystemExit):  # str(SystemExit(0)) is "0"
        msg = f"SystemExit {e.code} during {watchdog.phase!r}"
    return peers.RankOutcome(rank=rank, ok=False, exc_type="CellTimeout" if fired else type(e).__name__, exc_msg=msg,
                             traceback=traceback.format_exc()[-8000:], t_fail=time.time(), phase=watchdog.phase,
                             where=watchdog.where if fired else None, in_collective=watchdog.in_collective if fired else None)


def _skip_reason(cell: Cell, scenario: Scenario) -> str | None:
    packages = dict.fromkeys(name.partition(".")[0] for name in scenario.requires)
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        return f"needs the Python package(s) {', '.join(missing)} (pip install 'fsdp-compat[hf]')"
    if cell.device == "cuda" and torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", cell.world_size)):
        return f"needs {cell.world_size} GPUs, {torch.cuda.device_count()} visible"
    needs = scenario.api if cell.variant == "api" else None
    if cell.variant == "vanilla" and scenario.sharding.reduce_scatter_unused_params:
        needs = UNUSED_PARAMS_API
    if needs is not None and not needs.available():
        return f"recipe needs {needs.describe()}, absent in this torch"
    if cell.init == "meta" and scenario.sharding.init == "full" and (gap := init_gap(scenario)):  # the run's choice
        return f"cannot run built on meta: {gap}"
    return None
