"""Why a cell cannot run here: a missing package, too few GPUs, a public API or a meta-device
init this torch or scenario lacks."""

from __future__ import annotations

import importlib.util
import os

import torch

from harness.plan.cells import Cell
from harness.scenario.spec import UNUSED_PARAMS_API, Scenario
from harness.train.meta_init import init_gap

__all__ = ["skip_reason"]


def skip_reason(cell: Cell, scenario: Scenario) -> str | None:
    """The reason ``cell`` is skipped on this rank, or None."""
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
