"""Why a cell cannot run here: a missing package or too few GPUs (not declared by the scenario:
not as documented), a public API or a meta-device init this torch or scenario lacks."""

from __future__ import annotations

import importlib.util
import os

import torch

from harness.plan.cells import Cell
from harness.results.outcome import CellOutcome
from harness.scenario.spec import UNUSED_PARAMS_API, Scenario
from harness.train.meta_build import init_gap

__all__ = ["skip_fields"]


def skip_fields(cell: Cell, scenario: Scenario) -> CellOutcome | None:
    """The outcome of a skip of ``cell`` on this rank (None where it runs): ``reason``, and
    ``missing`` where the machine lacks something the scenario does not declare (a package,
    GPUs), which makes the skip not as documented."""
    packages = dict.fromkeys(name.partition(".")[0] for name in scenario.requires)
    lacking = [name for name in packages if importlib.util.find_spec(name) is None]
    if lacking:
        return CellOutcome(status="skip", missing=f"Python package(s) {', '.join(lacking)}",
                    reason=f"needs the Python package(s) {', '.join(lacking)} (pip install 'fsdp-compat[hf]')")
    if cell.device == "cuda" and torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", cell.world_size)):
        return CellOutcome(status="skip", missing=f"{cell.world_size} GPUs",
                    reason=f"needs {cell.world_size} GPUs, {torch.cuda.device_count()} visible")
    reason = _declared(cell, scenario)
    return CellOutcome(status="skip", reason=reason) if reason else None


def _declared(cell: Cell, scenario: Scenario) -> str | None:
    """A skip the scenario or the run declares: a torch feature (``Scenario.hooks``), a public API
    or a meta-device build this torch lacks."""
    for hook in scenario.hooks:
        if why := hook.unavailable():
            return why
    needs = scenario.api if cell.variant == "api" else None
    if cell.variant == "vanilla" and scenario.sharding.reduce_scatter_unused_params:
        needs = UNUSED_PARAMS_API
    if needs is not None and not needs.available():
        return f"recipe needs {needs.describe()}, absent in this torch"
    if cell.init == "meta" and scenario.sharding.init == "full" and (gap := init_gap(scenario)):  # the run's choice
        return f"cannot run built on meta: {gap}"
    return None
