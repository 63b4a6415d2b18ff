"""Checks beyond values (``harness.train.checks``): objects a scenario lists, run in order on a
cell whose values matched, the first with problems naming the mismatch."""

from __future__ import annotations

import pytest
import torch

from harness.train.checks import LedgerRules, ResourceGrowth, ShardingAsDeclared, first_problem
from harness.train.ledger import at_most
from harness.train.step import StepTensors
from tests.support import run_ranks


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


# --- a check kind added after checks became objects: harness/train/checks.py and this file only


def test_grad_dtype_names_each_grad_fsdp2_handed_out_in_another_dtype():
    from harness.train.checks import GradDtype

    observed = [StepTensors(step=0, grads={"a.weight": torch.ones(2, dtype=torch.bfloat16), "a.bias": torch.ones(2),
                                           "b.weight": None}), StepTensors(step=1)]
    assert GradDtype(torch.float32).problems(observed) == ["a.weight bfloat16 (wanted float32)"]
    assert GradDtype(torch.float32, params=("*.bias",)).problems(observed) == []
    assert first_problem((GradDtype(torch.float32),), observed) == "grad dtype: a.weight bfloat16 (wanted float32)"


def _train_bf16(rank: int, store_dir: str, out: str, wanted: str) -> None:
    import json

    import torch.distributed as dist
    from torch import nn

    from harness.plan.cells import Cell
    from harness.rank.judging import check_against_reference
    from harness.spec import Scenario, Sharding, mean_square
    from harness.train import fsdp
    from harness.train.checks import GradDtype

    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=1)
    try:
        scenario = Scenario(name="t", model=lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to(torch.bfloat16),
                            batch=lambda ctx: torch.randn(2, 4, dtype=torch.bfloat16),
                            sharding=Sharding(units=("0", "1")), forward=lambda m, b, c: mean_square(m(b)),
                            checks=(GradDtype(getattr(torch, wanted)),))
        cell = Cell(index=0, scenario="t", variant="vanilla", device="cpu", backend="gloo", world_size=1, mesh=(1,),
                    timeout_s=30)
        fields = check_against_reference(scenario, fsdp.train(scenario, cell, None, rank, 1), cell)
        with open(out, "w") as f:
            json.dump({k: getattr(fields, k) for k in ("status", "worst")}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wanted", ["float32", "bfloat16"])
def test_a_scenario_listing_grad_dtype_is_a_mismatch_where_the_grads_have_another(tmp_path, wanted):
    """bf16 params give bf16 grads: a scenario that wants float32 grads is a mismatch whose
    values match; one that wants bfloat16 passes."""
    import json

    out = tmp_path / "fields.json"
    run_ranks(_train_bf16, (str(tmp_path), str(out), wanted), nprocs=1)
    fields = json.loads(out.read_text())
    if wanted == "float32":
        assert fields["status"] == "mismatch" and fields["worst"].startswith("grad dtype: 0.weight bfloat16 (wanted"), fields
    else:
        assert fields["status"] == "pass", fields
