"""The training recipe, written once: the FSDP2 side and the single-process reference
both run it, each passing in a ``Side`` for the parts that differ.

Per step: the side's start of the step (the reference takes the params FSDP2 ended the
previous step with: ``harness.train.reference``), every micro-batch of the schedule
(forward and backward, with the scenario's gradient-sync settings), the end of the window
(where the scenario reduces after it), then grad scaling, a snapshot of the grads,
clipping and a snapshot of the clipped grads, the optimizer step (the side's own:
the reference steps with the grads FSDP2 stepped with), a snapshot of the params and of
which params have optimizer state, and ``zero_grad`` with ``set_to_none`` alternating
(True after even steps, False after odd ones) so both kinds run mid-training.

This module imports nothing from ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from harness.scenario.spec import Clip, MicroBatch, Scenario
from harness.train.step import StepTensors

__all__ = ["Side", "seed_batch", "set_to_none_after", "train"]

Grads = dict[str, "torch.Tensor | None"]


class Side(Protocol):
    """What differs between the FSDP2 run and the reference."""

    def begin_step(self, step: int) -> None:
        """Before the step's first micro-batch."""

    def micro_batch(self, step: int, k: int, micro_batch: MicroBatch) -> None:
        """Forward and backward of micro-batch ``k``; grads accumulate into ``.grad``."""

    def end_window(self) -> None:
        """After the window's last micro-batch (the FSDP2 side runs ``Scenario.hooks`` here)."""

    def scale(self, factor: float) -> None:
        """Multiply every grad by ``factor`` (the recipe's accumulation scaling)."""

    def grads(self) -> tuple[Grads, dict[str, list[int]]]:
        """Full grads by name, and names whose grad presence differed across ranks."""

    def clip(self, clip: Clip) -> float:
        """Clip the grads in place; return the total norm before clipping."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, snap: StepTensors) -> None:
        """``optimizer.step()`` (the reference: with the grads FSDP2 stepped with; it notes the
        size of each update on ``snap``)."""

    def params(self) -> dict[str, torch.Tensor]:
        """Full params by name (private CPU copies)."""

    def flush(self) -> None:
        """Complete the snapshots taken so far (the FSDP2 side gathers them here)."""


def seed_batch(seed: int, device: torch.device) -> None:
    """Seed the generator a scenario's ``batch`` draws from, on both sides alike. ``torch.manual_seed``
    also queues the seed for each accelerator type not initialized, with a formatted stack each time
    (0.25 ms a call, measured; a cell calls it once per rank and micro-batch, its reference once per
    rank, micro-batch and replica); a CPU cell draws from the CPU generator alone, so only it is seeded."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def set_to_none_after(step: int) -> bool:
    """The ``zero_grad(set_to_none=...)`` schedule."""
    return step % 2 == 0


def train(scenario: Scenario, side: Side, named: dict[str, nn.Parameter],
          after_step: Callable[[int, list[StepTensors]], object] | None = None) -> list[StepTensors]:
    """Run every step of ``scenario`` through ``side``; one snapshot per step.
    ``after_step(step, snapshots)`` is called after each step's params snapshot, before
    ``zero_grad`` (the FSDP2 side measures what the rank holds there)."""
    opt = scenario.optimizer.build(named.values())
    snapshots = []
    for step in range(scenario.steps):
        side.begin_step(step)
        for k, micro_batch in enumerate(scenario.schedule):
            side.micro_batch(step, k, micro_batch)
        side.end_window()
        snap = StepTensors(step=step)
        if scenario.grad_scale is not None:
            side.scale(scenario.grad_scale)
        snap.grads, snap.inconsistent = side.grads()
        if scenario.clip is not None:
            snap.grad_norm = side.clip(scenario.clip)
            snap.clipped, _ = side.grads()
        side.optimizer_step(opt, snap)
        snap.params = side.params()
        snap.opt_state = {n: bool(opt.state.get(p)) for n, p in named.items()}
        snapshots.append(snap)
        if after_step is not None:
            after_step(step, snapshots)
        opt.zero_grad(set_to_none=set_to_none_after(step))
    side.flush()
    return snapshots
