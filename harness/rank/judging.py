"""Judging a cell on its slot's first rank: the single-process reference, the comparison
with what FSDP2 produced, the ledger and resource checks; the record's outcome fields.

The variants of a scenario (vanilla, patched, deployed, api) mostly need the same
reference: it depends on the scenario as the variant runs it (the ``api`` variant's
sharding and quirk settings, ``Scenario.with_api``), the world size, the quirks the cell
measured (``reference_quirks``: the gloo AVG probe runs with the cell's patch set) and,
where a patch set changed what the reference computes with (anything outside
``torch.distributed``, e.g. ``torch.optim``, seen by the undo snapshot), that patch set.
``ReferenceCache`` computes it once per such key in a process and shares it; nothing
changes the snapshots of a reference once computed (the comparison only reads them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.plan.cells import Cell
from harness.rank import cuts
from harness.rank.phases import CLOCK
from harness.scenario.spec import Scenario
from harness.train import compare
from harness.train.ledger import check_problems
from harness.train.reference import quirks_for, run_reference
from harness.train.resources import growth_problems
from harness.train.step import StepTensors

__all__ = ["ReferenceCache", "dump", "judge"]


@dataclass(kw_only=True)
class _Reference:
    scenario: Scenario
    world_size: int
    quirks: tuple[str, ...]
    patch_set: tuple[str, ...]
    steps: list[StepTensors]


@dataclass(kw_only=True)
class ReferenceCache:
    """References computed in this process, newest last, at most ``keep``."""

    keep: int = 8
    entries: list[_Reference] = field(default_factory=list)
    hits: int = 0

    def get(self, scenario: Scenario, world_size: int, quirks: list[str],
            patch_set: tuple[str, ...] = ()) -> list[StepTensors]:
        """The reference of ``scenario`` at ``world_size`` under ``quirks``; ``patch_set``: the
        active set where it changed what the reference computes with, else ``()``."""
        if not cuts.enabled("reference_cache"):
            return run_reference(scenario, world_size, quirks=quirks)
        for entry in self.entries:
            if (entry.world_size, entry.quirks, entry.patch_set) == (world_size, tuple(quirks), patch_set) \
                    and _same(entry.scenario, scenario):
                self.hits += 1
                return entry.steps
        steps = run_reference(scenario, world_size, quirks=quirks)
        self.entries = [*self.entries[-(self.keep - 1):], _Reference(
            scenario=scenario, world_size=world_size, quirks=tuple(quirks), patch_set=patch_set, steps=steps)]
        return steps


def _same(a: Scenario, b: Scenario) -> bool:
    """The same recipe: the same object, or equal in every field (``with_api`` makes copies)."""
    try:
        return a is b or bool(a == b)
    except Exception:  # a field whose == does not give a truth value
        return False


def judge(scenario: Scenario, observed: list[StepTensors], cell: Cell, cache: ReferenceCache | None = None,
          patch_set: tuple[str, ...] = ()) -> dict[str, Any]:
    sums = observed[0].reduction_sums if observed else None
    quirks = quirks_for(torch_version=torch.__version__, backend=cell.backend, sharding=scenario.sharding,
                        reduction_sums=sums) if scenario.reference_quirks else []
    reference = (cache or ReferenceCache()).get(scenario, cell.world_size, quirks, patch_set)
    CLOCK.enter("compare")
    result = compare.compare_runs(observed, reference)
    fields = {**result.as_record_fields(), "reference_quirks": quirks, "status": "pass" if result.ok else "mismatch"}
    fields["ledger"] = observed[0].ledger if observed else None
    if (problems := check_problems(scenario.ledger_checks, fields["ledger"])) and result.ok:
        fields.update(status="mismatch", worst="ledger: " + "; ".join(problems))
    fields["resources"] = observed[0].resources if observed else None
    if scenario.resource_check and (problems := growth_problems(fields["resources"])) and fields["status"] == "pass":
        fields.update(status="mismatch", worst="resources: " + "; ".join(problems))
    if result.reference_nonfinite:
        fields.update(status="error", exc_type="ScenarioError",
                      exc_msg=f"the reference itself is non-finite ({', '.join(result.reference_nonfinite[:3])}): "
                              "the scenario is wrong, not FSDP2")
    return fields


def dump(folder: str, cell: Cell, observed: list[StepTensors]) -> None:
    """Save the observed snapshots (for determinism checks and local reproduction)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{cell.scenario}-{cell.variant}-{cell.device}-w{cell.world_size}.pt")
    torch.save([s.__dict__ for s in observed], path)
