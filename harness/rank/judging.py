"""Judging a cell: the single-process reference, the comparison with what FSDP2 produced,
the ledger and resource checks; the cell's outcome (``CellOutcome``).

The judge computes them in its *referee* (``harness.rank.referee``): a process forked from the
rank's zygote (``harness.rank.forked``), a copy of the worker taken before any scenario or
patch code ran, so the reference never runs under the patch set it judges (a patched
``clip_grad_norm_`` or optimizer step would otherwise be compared with itself) nor under
anything an earlier cell left behind (the referee puts back what a reference changed, and
ends after one that changed anything). The cell's process saves what FSDP2 produced
(``save_observed``); the referee reads it and writes its fields (``LaunchPlan.verdict_file``). The reference is one step at a time from what
FSDP2 produced (``harness.train.reference``), so it is computed per cell, and read back by a
later cell of the launch whose FSDP2 side produced the same tensors (``harness.train.reuse``).

Backend quirks are modelled only where declared (``harness.train.reference.quirks_for``):
the gloo AVG sum on torch < 2.9 in a cell without its fix. The cell measures whether its
reduction sums (``harness.train.probe.reduction_sums``); a sum measured anywhere else is a
*finding* on the record, and the cell is judged against the true mean.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch

from harness.plan.cells import Cell
from harness.rank import handoff
from harness.rank.phases import CLOCK
from harness.results.outcome import CellOutcome
from harness.scenario.spec import Scenario
from harness.scenario.symptoms import Evidence
from harness.train import compare
from harness.train.checks import first_problem
from harness.train.faults import fault_named, faulty_forward
from harness.train.meta_build import as_meta
from harness.train.reference import GLOO_AVG_FIX, gloo_avg_declared, quirks_for, run_reference
from harness.train.reuse import References, reference_key, reused
from harness.train.step import StepTensors
from harness.vocabulary import Failure

__all__ = ["check_against_reference", "check_saved", "dump", "load_observed", "save_observed", "scenario_for"]

#: install statuses under which a patch is in force
_IN_FORCE = ("installed", "already-installed")


def scenario_for(scenarios: dict[str, Scenario], cell: Cell) -> Scenario:
    """The recipe ``cell`` runs: its scenario, built on meta where the run says so, with its
    public API on for the ``api`` variant."""
    scenario = scenarios[cell.scenario]
    scenario = as_meta(scenario) if cell.init == "meta" else scenario
    return scenario.with_api() if cell.variant == "api" else scenario


def check_saved(scenarios: dict[str, Scenario], cell: Cell, observed_file: str | os.PathLike,
                installs: dict[str, dict[str, str]] | None = None, references: References | None = None) -> CellOutcome:
    """``check_against_reference`` on the snapshots the judging rank saved; a reference that
    raises is the cell's error, not a lost cell."""
    try:
        with CLOCK.timed("gather"):  # what the judging rank handed over
            observed = load_observed(observed_file)
        return check_against_reference(scenario_for(scenarios, cell), observed, cell, installs, references=references)
    except Exception as e:
        return CellOutcome(status="error", exc_type=type(e).__name__, exc_msg=f"reference/compare failed: {e}"[:500],
                           traceback=traceback.format_exc()[-8000:])


def check_against_reference(scenario: Scenario, observed: list[StepTensors], cell: Cell,
          installs: dict[str, dict[str, str]] | None = None, references: References | None = None) -> CellOutcome:
    """The outcome of a cell whose every rank trained: the reference (one step at a
    time from ``observed``), the comparison, the ledger and resource checks. ``installs``:
    the cell's patch install outcomes (whether the gloo AVG fix is in force); ``references``:
    where references are reused from and left (``harness.train.reuse``)."""
    sums = observed[0].reduction_sums if observed else None
    fixed = (installs or {}).get(GLOO_AVG_FIX, {}).get("status") in _IN_FORCE
    quirks, findings = [], []
    if scenario.reference_quirks:
        quirks = quirks_for(torch_version=torch.__version__, backend=cell.backend, sharding=scenario.sharding,
                            reduction_sums=sums, fixed=fixed)
        declared = gloo_avg_declared(torch_version=torch.__version__, backend=cell.backend, fixed=fixed)
        if sums and not declared:
            where = "with its fix installed" if fixed else f"on torch {torch.__version__}"
            findings.append(f"gloo reduction summed where FSDP2 asks for an average ({where}): judged against "
                            "the true mean")
    device, caveat = reference_device(cell)
    if caveat:
        quirks = [*quirks, caveat]
    CLOCK.enter("reference")
    what = f"{cell.scenario}|{cell.init}|{cell.variant == 'api'}|{cell.device}|{cell.world_size}|{quirks}|" \
           f"{cell.reference_inputs}"
    reference, source = reused(references, reference_key(what, observed),
                          lambda: run_reference(scenario, cell.world_size, quirks=quirks, observed=observed,
                                                        device=device))
    CLOCK.enter("compare")
    result = compare.compare_runs(observed, reference)
    out = CellOutcome(**result.as_record_fields(), reference_quirks=quirks, status="pass" if result.ok else "mismatch",
                      findings=findings, ledger=observed[0].ledger if observed else None,
                      resources=observed[0].resources if observed else None, reference_from=source)
    if result.ok and (worst := first_problem(scenario.checks, observed)):
        out.update(status="mismatch", worst=worst)
    if result.reference_nonfinite:
        out.update(status="error", exc_type=Failure.SCENARIO_ERROR,
                      exc_msg=f"the reference itself is non-finite ({', '.join(result.reference_nonfinite[:3])}): "
                              "the scenario is wrong, not FSDP2")
    expect = scenario.expected(variant=cell.variant, torch_version=torch.__version__, device=cell.device,
                               world_size=cell.world_size)
    if out.status == "mismatch" and expect.symptom is not None and cell.fault is None:
        saw = expect.symptom(Evidence(observed=observed, reference=reference, world_size=cell.world_size,
                                      failed=[d for d in result.diffs if not d.ok]))
        out.update(symptom_seen=saw is None, symptom=saw or "seen")
    if cell.fault is not None:
        affected = _affected(scenario, cell, reference, quirks, device)
        caught = {d.name for d in result.diffs if d.step == 0 and not d.ok and d.kind in ("grad", "presence", "replicas")}
        out.update(fault=cell.fault, fault_affected=sorted(affected), fault_missed=sorted(affected - caught))
    return out


#: the reference's caveat where a cuda cell's reference could not run on the GPU
CPU_REFERENCE = "reference on the CPU: CUDA unusable in the reference process (initialized before its fork)"


def reference_device(cell: Cell) -> tuple[torch.device, str | None]:
    """Where the reference runs: the cell's device, so both sides use the same kernels (a
    CPU reference for a GPU cell differs by more than rounding where a tensor is noise-sized,
    ``harness.train.reference``). A cuda cell's reference process is forked from a zygote
    that never initialized CUDA (``harness.rank.worker``); if CUDA is unusable there anyway,
    the CPU, and the caveat on the record's ``reference_quirks``."""
    if cell.device != "cuda":
        return torch.device("cpu"), None
    if torch.cuda._is_in_bad_fork() or not torch.cuda.is_available():
        return torch.device("cpu"), CPU_REFERENCE
    try:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    except RuntimeError as e:  # the driver initialized before the fork, not through torch
        raise RuntimeError(f"the reference process cannot use CUDA (initialized before its zygote forked?): {e}") from e
    return torch.device("cuda", torch.cuda.current_device()), None


def _affected(scenario: Scenario, cell: Cell, reference: list[StepTensors], quirks: list[str],
              device: torch.device) -> set[str]:
    """The parameters whose step-0 grad ``cell.fault`` changes: for a grad fault every grad that
    is not all zero; for a loss fault those whose grad the reference, with the fault modelled,
    gets different."""
    fault = fault_named(cell.fault)
    assert fault is not None
    grads = reference[0].grads
    if fault.loss_factor is None:
        return {n for n, g in grads.items() if g is not None and bool(g.abs().max() > 0)}
    one_step = scenario.replace(steps=1)
    clean = run_reference(one_step, cell.world_size, quirks=quirks, device=device)[0].grads
    faulted = run_reference(faulty_forward(one_step, fault), cell.world_size, quirks=quirks, device=device)[0].grads
    return {n for n in clean if (clean[n] is None) != (faulted.get(n) is None)
            or (clean[n] is not None and not torch.equal(clean[n], faulted[n]))}


def save_observed(path: str | os.PathLike, observed: list[StepTensors]) -> None:
    """What FSDP2 produced, for the reference process (and ``run --dump``): ``harness.rank.handoff``."""
    handoff.save([s.__dict__ for s in observed], path)


def load_observed(path: str | os.PathLike) -> list[StepTensors]:
    return [StepTensors(**d) for d in handoff.load(path)]


def dump(folder: str | os.PathLike, cell: Cell, observed_file: str | os.PathLike) -> None:
    """Keep the observed snapshots (for determinism checks and local reproduction)."""
    os.makedirs(folder, exist_ok=True)
    target = Path(folder) / f"{cell.scenario}-{cell.variant}-{cell.device}-w{cell.world_size}.pt"
    with CLOCK.timed("gather"):
        torch.save(handoff.load(observed_file, copies=True), target)  # as ``torch.load`` reads it

