"""Faults injected on the FSDP2 side of a cell (``run --fault NAME``), to measure what each
scenario's checks can see: a cell that passes must turn into a mismatch that names every
parameter the fault changed (``nox -s sensitivity``, ``harness sensitivity``).

Each fault acts on step 0 only, so what it changed is known exactly:

* ``grad_rel``: every grad after the accumulation window off by a relative 1e-4 (bf16 and
  fp16 grads: by 4 units in the last place, ``4 * eps``), as a reduction that is slightly off;
* ``sign_flip``: the largest element of every grad negated, on one rank only (the lowest that
  holds it: HSDP replicas then disagree);
* ``drop_micro_batch``: the first micro-batch's loss multiplied by 0 on every rank (its
  grads lost, its collectives unchanged);
* ``double_rank``: the last rank's loss doubled in every micro-batch (one rank's grads twice
  too large before the reduction).

The loss faults can be modelled by the reference, which tells which parameters they change
(``affected``); the grad faults change every parameter with a nonzero grad.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.scenario.spec import Ctx, Scenario
from harness.vocabulary import FAULT_NAMES

__all__ = ["FAULTS", "Fault", "fault_named", "faulty_forward"]

#: the relative error ``grad_rel`` puts in an fp32 grad; lower precisions get ``ULPS`` units in the last place
REL = 1e-4
ULPS = 4


@dataclass(kw_only=True, frozen=True)
class Fault:
    name: str
    summary: str
    #: a loss fault: the factor for (rank, world size, micro-batch) at step 0
    loss_factor: Callable[[int, int, int], float] | None = None
    #: a grad fault: applied to this rank's grads (name -> local tensor) after step 0's window
    grads: Callable[[dict[str, torch.Tensor], int, torch.device], None] | None = None


def _relative(grads: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    for local in grads.values():
        rel = REL if local.dtype in (torch.float32, torch.float64) else ULPS * torch.finfo(local.dtype).eps
        local.mul_(1 + rel)


def _flip_largest(grads: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    """Negate each grad's largest element on the lowest rank that holds it (one collective)."""
    names = sorted(grads)
    mine = torch.tensor([float(grads[n].abs().max()) if grads[n].numel() else -1.0 for n in names],
                        dtype=torch.float64, device=device)
    world = dist.get_world_size()
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    table = torch.stack(everyone).cpu()
    for k, name in enumerate(names):
        if int(table[:, k].argmax()) == rank and grads[name].numel():
            flat = grads[name].view(-1)
            i = int(flat.abs().argmax())
            flat[i] = -flat[i]


FAULTS: dict[str, Fault] = {f.name: f for f in (  # in the order of ``harness.vocabulary.FAULT_NAMES``
    Fault(name="grad_rel", summary=f"every grad off by {REL:g} relative ({ULPS} ulps in bf16/fp16) after the window",
          grads=_relative),
    Fault(name="sign_flip", summary="the largest element of every grad negated on one rank", grads=_flip_largest),
    Fault(name="drop_micro_batch", summary="the first micro-batch's grads dropped (its loss times 0, every rank)",
          loss_factor=lambda rank, world, micro_batch: 0.0 if micro_batch == 0 else 1.0),
    Fault(name="double_rank", summary="the last rank's grads doubled (its loss times 2)",
          loss_factor=lambda rank, world, micro_batch: 2.0 if rank == world - 1 else 1.0),
)}


assert tuple(FAULTS) == FAULT_NAMES


def fault_named(name: str | None) -> Fault | None:
    """The fault called ``name`` (None: none); ``ValueError`` naming the known ones."""
    if name is None:
        return None
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r} (choose from {', '.join(FAULTS)})")
    return FAULTS[name]


def faulty_forward(scenario: Scenario, fault: Fault) -> Scenario:
    """``scenario`` with a loss fault applied to its step 0 (what the reference models to know
    which parameters the fault changes)."""
    assert fault.loss_factor is not None
    forward = scenario.forward

    def faulty(model, batch, ctx: Ctx):
        loss = forward(model, batch, ctx)
        return loss * fault.loss_factor(ctx.rank, ctx.world_size, ctx.micro_batch) if ctx.step == 0 else loss

    return scenario.replace(forward=faulty)
