"""The per-rank program that torchrun starts: runs many cells in one launch.

Each cell gets a fresh default process group (``PrefixStore`` over torchrun's store), a
fresh model and fresh optimizer; ranks agree on the end of a cell through the store
(``harness.peers``), not through the process group, so a cell that broke its group
cannot break the next one.

Rank 0 judges the cell (reference + comparison) and appends its record before the next
cell starts. If some rank never reports, rank 0 records the cell as a hang and the launch
ends with exit code 3; the launcher relaunches for the remaining cells.

Usage (by the launcher): ``torchrun ... -m harness.worker --plan PLAN.json``
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from harness import compare, peers, record
from harness.isolation import TorchSnapshot, forget_module
from harness.patching import install_set, load_patches_module
from harness.plan import Cell, LaunchPlan
from harness.reference import quirks_for, run_reference
from harness.registry import load_scenarios
from harness.snapshot import StepSnapshot
from harness.spec import UNUSED_PARAMS_API, Scenario

__all__ = ["main"]

EXIT_POISONED = 3
#: how long a failed rank waits for its peers to report before it leaves the launch
_PEER_GRACE_S = 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="harness.worker")
    parser.add_argument("--plan", required=True)
    args = parser.parse_args(argv)
    plan = LaunchPlan.load(args.plan)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if plan.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    store = _connect_store(world)
    scenarios = load_scenarios(plan.scenario_dirs).scenarios
    patches = _PatchSets(plan)
    for cell in plan.cells:
        installs, utilities = patches.activate(cell.patches)
        scenario = scenarios[cell.scenario]
        if cell.variant == "api":
            scenario = scenario.with_api()
        if not _run_cell(cell, plan, scenario, installs, utilities, store, rank, world):
            _exit(EXIT_POISONED)
    _exit(0)  # avoids the frequent abort at interpreter exit after destroy_process_group()


def _connect_store(world: int) -> dist.Store:
    """A client of the store torchrun's agent hosts (or rank 0 hosts one without an agent)."""
    use_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=(not use_agent and int(os.environ["RANK"]) == 0),
        timeout=datetime.timedelta(seconds=120), wait_for_workers=False,
    )


class _PatchSets:
    """Installs one cell's patch set at a time; switching sets undoes the previous one.

    Patches are process-global: before a set is installed torch's attributes are
    snapshotted (``harness.isolation``) and the patches module is imported afresh; the
    next switch restores the snapshot. Install outcomes never raise.
    """

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.active: tuple[str, ...] = ()
        self.snapshot: TorchSnapshot | None = None
        self.installs: dict[str, dict[str, str]] = {}
        self.utilities: dict[str, Any] = {}

    def activate(self, names: tuple[str, ...]) -> tuple[dict[str, dict[str, str]], dict[str, Any]]:
        if names == self.active:
            return self.installs, self.utilities
        if self.snapshot is not None:
            self.snapshot.restore()
            self.snapshot = None
        self.active, self.installs, self.utilities = names, {}, {}
        if names:
            self.snapshot = TorchSnapshot.take()
            forget_module(self.plan.patches_module)
            self.installs, self.utilities = self._install(list(names))
        return self.installs, self.utilities

    def _install(self, names: list[str]) -> tuple[dict[str, dict[str, str]], dict[str, Any]]:
        try:
            module = load_patches_module(self.plan.patches_module)
        except ValueError as e:
            return {n: {"status": "error", "reason": str(e)} for n in names}, {}
        return install_set(module, names, self.plan.patch_mapping, label=self.plan.patches_module)


# -- one cell ---------------------------------------------------------------------------


def _run_cell(cell: Cell, plan: LaunchPlan, scenario: Scenario, installs: dict[str, dict[str, str]],
              utilities: dict[str, Any], store: dist.Store, rank: int, world: int) -> bool:
    """Run one cell on this rank; returns False when the launch must end."""
    prefix = f"{plan.launch_id}/{cell.index}"
    t0 = time.time()
    if rank == 0:
        record.mark_progress(plan.progress_path, cell.index, "start")
    cell_installs = {n: installs[n] for n in cell.patches}
    skip = _skip_reason(cell, scenario, world)
    install_error = next((f"patch install error: {n}: {v['reason']}" for n, v in cell_installs.items()
                          if v["status"] == "error"), None)
    observed: list[StepSnapshot] | None = None
    outcome = peers.RankOutcome(rank=rank, ok=True)
    if skip is None and install_error is None:
        observed, outcome = _train_guarded(cell, scenario, utilities, store, prefix, rank, world)
    peers.post(store, prefix, outcome)
    abandon = not outcome.ok and not peers.all_reported(store, prefix, world, _PEER_GRACE_S)
    if abandon and peers.shutdown_peer_sockets() and peers.all_reported(store, prefix, world, _PEER_GRACE_S):
        # A peer was blocked in a collective waiting for this rank, and gloo does not close
        # a failed group's sockets: shutting this process's collective sockets made it
        # fail at once ("Connection closed by peer"), and the launch goes on.
        abandon = False
    if abandon:
        # Still blocked (a backend whose sockets did not unblock it): leaving the process
        # does. The launch then ends and the launcher relaunches for the remaining cells.
        store.set(f"{prefix}/abandoned", str(rank))
        if rank != 0:
            _exit(0)
    if rank != 0:
        recorded = peers.wait(store, [f"{prefix}/recorded"], cell.timeout_s + 60)
        return recorded and not store.check([f"{prefix}/abandoned"])
    if abandon:
        outcomes, missing = [outcome], []
    else:
        # bounded by the cell's own deadline, so a hung peer is reported within the timeout
        outcomes, missing = peers.collect_outcomes(store, prefix, world, max(1.0, t0 + cell.timeout_s - time.time()))
    fields: dict[str, Any] = {"patch_install": cell_installs}
    if skip is not None:
        fields.update(status="skip", reason=skip)
    elif install_error is not None:
        fields.update(status="error", exc_type="PatchInstallError", exc_msg=install_error)
    elif missing:
        fields.update(status="hang", exc_msg=f"rank(s) {missing} did not finish the cell within {cell.timeout_s:g} s",
                      failing_rank=missing[0])
    elif all(o.ok for o in outcomes):
        assert observed is not None
        if plan.dump_dir:
            _dump(plan.dump_dir, cell, observed)
        fields.update(_judge_guarded(scenario, observed, world, cell))
    else:
        fields.update(peers.blame(outcomes))
    rec = record.new_record(cell, run_id=plan.run_id, launch_id=plan.launch_id, patches_module=plan.patches_module,
                            patches_module_id=plan.patches_module_id, t0=t0, **fields)
    record.append(plan.out_path, record.finish(rec, t0))
    store.set(f"{prefix}/recorded", "1")
    return not missing and not store.check([f"{prefix}/abandoned"])


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _skip_reason(cell: Cell, scenario: Scenario, world: int) -> str | None:
    if cell.device == "cuda" and torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", world)):
        return f"needs {world} GPUs, {torch.cuda.device_count()} visible"
    if scenario.sharding.reduce_scatter_unused_params and cell.variant in ("vanilla", "api"):
        if not UNUSED_PARAMS_API.available():
            return f"recipe needs {UNUSED_PARAMS_API.describe()}, absent in this torch"
    return None


def _train_guarded(cell: Cell, scenario: Scenario, utilities: dict[str, Any], store: dist.Store, prefix: str,
                   rank: int, world: int) -> tuple[list[StepSnapshot] | None, peers.RankOutcome]:
    from harness import fsdp_run

    dist.init_process_group(backend=cell.backend, store=dist.PrefixStore(f"{prefix}/pg", store), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=cell.timeout_s))
    try:
        observed = fsdp_run.train(scenario, cell, utilities, rank, world)
        outcome = peers.RankOutcome(rank=rank, ok=True)
    except Exception as e:
        lines = str(e).strip().splitlines()
        observed, outcome = None, peers.RankOutcome(
            rank=rank, ok=False, exc_type=type(e).__name__, exc_msg=lines[0][:500] if lines else "",
            traceback=traceback.format_exc()[-8000:], t_fail=time.time(),
        )
        _abort_groups()
    if dist.is_initialized():
        dist.destroy_process_group()
    return observed, outcome


def _abort_groups() -> None:
    """Abort the failed cell's groups (NCCL: frees communicators stuck in a collective).

    On gloo this does not close the group's sockets (measured on 2.13): peers blocked in
    a collective are released by ``peers.shutdown_peer_sockets`` instead.
    """
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        try:
            abort()
            return
        except Exception:
            pass
    gc.collect()  # no abort in this torch: drop the failed frames and their group references


def _judge_guarded(scenario: Scenario, observed: list[StepSnapshot], world: int, cell: Cell) -> dict[str, Any]:
    """Reference + comparison; a broken reference must not lose the cell."""
    try:
        quirks = quirks_for(torch_version=torch.__version__, backend=cell.backend) if scenario.reference_quirks else []
        reference = run_reference(scenario, world, quirks=quirks)
        result = compare.compare_runs(observed, reference)
        fields = {**result.as_record_fields(), "reference_quirks": quirks, "status": "pass" if result.ok else "mismatch"}
        if result.reference_nonfinite:
            where = ", ".join(result.reference_nonfinite[:3])
            fields.update(status="error", exc_type="ScenarioError",
                          exc_msg=f"the reference itself is non-finite ({where}): the scenario is wrong, not FSDP2")
        return fields
    except Exception as e:
        return dict(status="error", exc_type=type(e).__name__, exc_msg=f"reference/compare failed: {e}"[:500],
                    traceback=traceback.format_exc()[-8000:])


def _dump(folder: str, cell: Cell, observed: list[StepSnapshot]) -> None:
    """Save the observed snapshots (for determinism checks and local reproduction)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{cell.scenario}-{cell.variant}-{cell.device}-w{cell.world_size}.pt")
    torch.save([s.__dict__ for s in observed], path)


if __name__ == "__main__":
    main()
