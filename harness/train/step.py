"""What one optimizer step left behind, in the same shape for FSDP2 and the reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["StepTensors"]


@dataclass(kw_only=True)
class StepTensors:
    """Full (unsharded) tensors on CPU, keyed by parameter name.

    ``grads``: after accumulation (and grad scaling), before clipping; ``None`` where the
    parameter has no grad. ``inconsistent``: names whose grad presence differed across
    ranks (FSDP2 side only), with the ranks that had a grad. ``clipped``: after clipping
    (empty without clipping). ``params``: after ``optimizer.step()``. ``opt_state``:
    whether the optimizer holds state for the parameter.
    """

    step: int
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    inconsistent: dict[str, list[int]] = field(default_factory=dict)
    grad_norm: float | None = None
    clipped: dict[str, torch.Tensor | None] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    opt_state: dict[str, bool] = field(default_factory=dict)
    #: the FSDP2 side: "<grad|clipped|param> <name>" -> the largest difference between the pieces
    #: two ranks hold of one region (HSDP replicas: they must be equal; ``harness.train.gather``)
    diverged: dict[str, float] = field(default_factory=dict)
    #: the reference only: the largest change the optimizer step made to each param
    #: (``max |after - before|``): the scale its post-step param is judged on (``harness.train.compare``)
    update: dict[str, float] = field(default_factory=dict)
    #: measured before training (FSDP2 side, first step only): whether FSDP2's reduction
    #: over the shard group summed where it should average (``harness.train.probe.reduction_sums``);
    #: None where not measured
    reduction_sums: bool | None = None
    #: the collectives of every step (FSDP2 side, on the first snapshot only): ``harness.train.ledger.Ledger.rows()``
    ledger: list[list[Any]] | None = None
    #: what the rank held after every step (FSDP2 side, first snapshot only): ``harness.train.resources`` rows
    resources: list[list[Any]] | None = None
    #: how the sharding FSDP2 applied differs from the scenario's (FSDP2 side, first snapshot only;
    #: ``harness.train.requested``): one line per parameter and field
    sharding: list[str] | None = None
