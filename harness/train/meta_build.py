"""Meta-device initialization: build on ``meta``, ``fully_shard``, ``to_empty``, then every
sub-module's ``reset_parameters()`` under the model seed, as large-model stacks do.

``Sharding(init="meta")`` runs one scenario this way (bug N is about it); ``run --init
meta`` runs every scenario this way (``as_meta``), with ``meta_init_full_rng``
(``harness.plan.cells.META_WORKAROUND``) installed in every variant: without it every rank
draws the same random stream for its shard on CPU, and the values differ from one process's
on CUDA, and no scenario's own verdict could show. A scenario whose model is not initialised
by ``reset_parameters`` alone (weights set in ``__init__``, a cast after construction, a
Hugging Face model's ``_init_weights``) cannot run this way: ``init_gap`` builds it both
ways in one process and names the first parameter that differs, and the cell is skipped
with that reason.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from harness.scenario.sharding import Sharding
from harness.scenario.spec import MODEL_SEED, Scenario

__all__ = ["as_meta", "build_on_meta", "checkpoint_on_rank0", "init_gap", "init_on", "load_from_rank0",
           "materialized_on"]


def init_on(model: nn.Module, device: torch.device) -> None:
    """Materialise a meta-built (and possibly sharded) model on ``device`` and run every
    sub-module's ``reset_parameters()`` under ``MODEL_SEED``."""
    model.to_empty(device=device)
    torch.manual_seed(MODEL_SEED)
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def checkpoint_on_rank0(scenario: Scenario, device: torch.device, rank: int) -> dict[str, torch.Tensor] | None:
    """Rank 0's checkpoint for ``Sharding(init="rank0")``: the model built in full under
    ``MODEL_SEED``, its state dict (what a saved checkpoint holds: no non-persistent buffers);
    ``None`` on the other ranks."""
    if rank != 0:
        return None
    torch.manual_seed(MODEL_SEED)
    return scenario.model().to(device).state_dict()


def load_from_rank0(model: nn.Module, checkpoint: dict[str, torch.Tensor] | None, device: torch.device) -> None:
    """Materialise a meta-built, sharded model on ``device``, every floating tensor NaN (what
    ``to_empty`` leaves is uninitialised memory; NaN makes it the same on every machine), then
    load rank 0's ``checkpoint`` into every rank with ``set_model_state_dict(full_state_dict=True,
    broadcast_from_rank0=True)``. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor

    model.to_empty(device=device)
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            if local.is_floating_point():
                local.fill_(float("nan"))
    set_model_state_dict(model, checkpoint or {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def materialized_on(sharding: Sharding, device: torch.device) -> torch.device:
    """Where a meta-built model is materialised and initialised: the rank's device, or the
    CPU where its parameters are offloaded (FSDP2 refuses others: "FSDP parameters should be
    materialized on CPU when enabling CPU offloading"), so ``reset_parameters`` draws from
    that device's random stream."""
    return torch.device("cpu") if sharding.offload else device


def build_on_meta(scenario: Scenario, device: torch.device) -> nn.Module:
    """What one process makes of a meta-init recipe on ``device``: the model built on meta,
    materialised where the sharded run materialises it (``materialized_on``), initialised
    under the model seed, then moved to ``device``. On the CPU this is the constructor's own
    model wherever ``init_gap`` finds none; on a GPU the values come from the GPU's stream."""
    with torch.device("meta"):
        model = scenario.model()
    init_on(model, materialized_on(scenario.sharding, device))
    return model.to(device)


def as_meta(scenario: Scenario) -> Scenario:
    """``scenario`` built on the meta device (unchanged where it already is)."""
    if scenario.sharding.init == "meta":
        return scenario
    return dataclasses.replace(scenario, sharding=dataclasses.replace(scenario.sharding, init="meta"))


_gaps: dict[int, str | None] = {}


def init_gap(scenario: Scenario) -> str | None:
    """Why ``scenario``'s model cannot be built on meta and initialised by ``reset_parameters``
    to what its constructor makes under the same seed; None where it can (cached per scenario)."""
    key = id(scenario.model)
    if key not in _gaps:
        _gaps[key] = _measure_gap(scenario)
    return _gaps[key]


def _measure_gap(scenario: Scenario) -> str | None:
    rng = torch.get_rng_state()
    try:
        torch.manual_seed(MODEL_SEED)
        full = scenario.model()
        torch.manual_seed(MODEL_SEED)
        with torch.device("meta"):
            built = scenario.model()
        init_on(built, torch.device("cpu"))
    except Exception as e:  # a model that cannot be built on meta at all
        return f"its model cannot be built on the meta device ({type(e).__name__}: {str(e)[:120]})"
    finally:
        torch.set_rng_state(rng)
    want, got = full.state_dict(), built.state_dict()
    if want.keys() != got.keys():
        return "built on meta, its model has other parameters and buffers"
    for name, value in want.items():
        if value.dtype != got[name].dtype or not torch.equal(value, got[name]):
            return (f"its model's init is not reset_parameters() alone: {name} differs when built on meta "
                    f"(set in __init__, cast after construction, or initialised by the model's own hooks)")
    return None
