"""Checks beyond values (``harness.train.checks``): objects a scenario lists, run in order on a
cell whose values matched, the first with problems naming the mismatch."""

from __future__ import annotations

import torch

from harness.train.checks import LedgerRules, ResourceGrowth, ShardingAsDeclared, first_problem
from harness.train.ledger import at_most
from harness.train.step import StepTensors


def _observed(*, gathers: int = 1, sharding: list[str] | None = None, resources: list | None = None):
    # a ledger row: step, micro-batch, phase, kind, group size, dtype, count, bytes (``Ledger.rows``)
    rows = [[0, 0, "backward", "all_gather", 2, "float32", gathers, 32 * gathers]]
    first = StepTensors(step=0, grads={"w": torch.ones(2)}, ledger=rows, sharding=sharding,
                        resources=resources)
    return [first, StepTensors(step=1)]


def test_each_check_names_its_kind_and_the_first_with_problems_decides():
    ledger = LedgerRules(at_most("all_gather", 1, phase="backward"))
    growing = [[s, 10 + s, 100 + s, None] for s in range(6)]
    assert first_problem((ledger,), _observed()) is None
    assert first_problem((ledger,), _observed(gathers=3)).startswith("ledger: ")
    assert first_problem((ResourceGrowth(),), _observed(resources=growing)).startswith("resources: ")
    assert first_problem((ResourceGrowth(),), _observed(resources=growing[:1] * 6)) is None
    both = first_problem((ResourceGrowth(), ledger), _observed(gathers=3, resources=growing))
    assert both.startswith("resources: ")  # the scenario's order


def test_every_cell_runs_the_sharding_check_after_its_scenarios_own():
    five = [f"p{i} placement" for i in range(5)]
    assert first_problem((), _observed(sharding=five)) == "sharding: p0 placement; p1 placement; p2 placement (and 2 more)"
    ledger = LedgerRules(at_most("all_gather", 1, phase="backward"))
    assert first_problem((ledger,), _observed(gathers=3, sharding=five)).startswith("ledger: ")
    assert ShardingAsDeclared().problems([]) == []


def test_a_scenario_measures_what_its_checks_need():
    from torch import nn

    from harness.spec import Scenario, Sharding, mean_square

    def scenario(**kw):
        return Scenario(name="t", model=lambda: nn.Linear(2, 2), batch=lambda ctx: torch.ones(1, 2),
                        sharding=Sharding(units=()), forward=lambda m, b, c: mean_square(m(b)), **kw)

    assert scenario(checks=(ResourceGrowth(),)).measures("resources")
    assert not scenario(checks=(LedgerRules(),)).measures("resources") and not scenario().measures("resources")
