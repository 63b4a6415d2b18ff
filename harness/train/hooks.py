"""Hooks: what a scenario adds to the FSDP2 side's training step beyond its schedule.

A scenario lists its hooks (``Scenario.hooks``); the FSDP2 side calls each at its point of the
recipe (``harness.train.recipe``), with the collectives it runs counted under the hook's
``phase`` in the cell's ledger. The single-process reference calls none: its micro-batches
already hold the window's full-batch grads. Where a hook needs the scenario declared a
certain way, ``problems(scenario)`` names what is wrong and the scenario does not load.

A hook may also say what the scenario needs of torch (``unavailable()``): where that is
absent, its cells are skipped with the reason (``NeedsTorch``).

A new kind of hook is a class here with ``phase`` and the points it implements, and the
scenarios that list it; nothing else in the harness changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from harness.scenario.apis import PublicApi
    from harness.scenario.spec import Scenario
    from harness.undertest.source import Utilities

__all__ = ["Hook", "HookPoint", "NeedsTorch", "ReduceAfterWindow", "ReshardAfterForward"]


@dataclass(frozen=True, kw_only=True)
class HookPoint:
    """What a hook sees at its point of the step (its start, or the end of its window)."""

    #: the root FSDP module
    root: nn.Module
    step: int
    #: the ``api`` variant's public API; ``None`` in every other variant
    api: PublicApi | None
    #: what the installed patch set provides (empty for vanilla)
    utilities: Utilities


class Hook:
    """What a hook is (a scenario lists instances)."""

    #: the ledger phase of its collectives, and the word in the rank's progress stamps
    phase: ClassVar[str] = ""
    #: it reduces the window's grads itself, after the last micro-batch, so every micro-batch
    #: runs with gradient sync off (otherwise the last one must sync)
    reduces_window: ClassVar[bool] = False

    def problems(self, scenario: Scenario) -> list[str]:
        """What in ``scenario`` this hook cannot work with; none: it can."""
        return []

    def unavailable(self) -> str | None:
        """Why this torch cannot run the scenario (its cells are skipped with it); None: it can."""
        return None

    def begin_step(self, at: HookPoint) -> None:
        """Before the step's first forward."""

    def end_window(self, at: HookPoint) -> None:
        """After the window's last backward, before grad scaling and the grads' snapshot."""


@dataclass(frozen=True)
class ReduceAfterWindow(Hook):
    """The stack learns that an accumulation window is over only after its last backward (MoE
    and pipeline schedules): every micro-batch runs with gradient sync off and the grads are
    reduced afterwards, by the ``api`` variant's ``PublicApi.finalize`` or the patches module's
    ``finalize_backward(root)``; without either (vanilla) gradient sync is turned back on, as a
    stack without either does, which reduces nothing already accumulated."""

    phase: ClassVar[str] = "finalize"
    reduces_window: ClassVar[bool] = True

    def problems(self, scenario: Scenario) -> list[str]:
        if any(mb.sync for mb in scenario.schedule):
            return ["ReduceAfterWindow runs every micro-batch with gradient sync off "
                    "(use accumulate(n, last_sync=False))"]
        return []

    def end_window(self, at: HookPoint) -> None:
        if at.api is not None and at.api.finalize is not None:
            at.api.finalize(at.root)
        elif at.utilities.finalize_backward is not None:
            at.utilities.finalize_backward(at.root)
        else:
            at.root.set_requires_gradient_sync(True)


@dataclass(frozen=True)
class NeedsTorch(Hook):
    """The scenario needs ``attr`` of torch (``"Tensor.grad_dtype"``, looked up from ``torch``),
    which torch has since ``since``; its cells are skipped where it is absent."""

    attr: str
    since: str
    phase: ClassVar[str] = "needs"

    def unavailable(self) -> str | None:
        import torch

        owner: object = torch
        for part in self.attr.split("."):
            if not hasattr(owner, part):
                return f"recipe needs torch.{self.attr} (torch >= {self.since}), absent in this torch"
            owner = getattr(owner, part)
        return None


@dataclass(frozen=True)
class ReshardAfterForward(Hook):
    """A unit's reshard-after-forward changed at run time: ``during`` from the start of each
    step until its window has run backward, ``between`` after it. Stacks keep an output head
    gathered from its forward until backward for a loss that reads its weight outside the
    head's forward (a fused linear cross-entropy), and let it reshard again between steps
    (evaluation, generation). Set through the ``api`` variant's public
    ``FSDPModule.set_reshard_after_forward`` (torch >= 2.8), else the patches module's
    ``set_reshard_after_forward(module, value, recurse=...)`` (a backport), else not at all
    (vanilla: the unit keeps what ``fully_shard`` gave it)."""

    unit: str
    during: bool = False
    between: bool = True
    phase: ClassVar[str] = "reshard"

    def problems(self, scenario: Scenario) -> list[str]:
        found = []
        if self.unit not in scenario.sharding.units:
            found.append(f"ReshardAfterForward: {self.unit!r} is not one of the units {scenario.sharding.units}")
        if scenario.api is not None and scenario.api.name != "FSDPModule.set_reshard_after_forward":
            found.append("ReshardAfterForward calls FSDPModule.set_reshard_after_forward: "
                         f"the scenario's api is {scenario.api.name}")
        return found

    def begin_step(self, at: HookPoint) -> None:
        self._set(at, self.during)

    def end_window(self, at: HookPoint) -> None:
        self._set(at, self.between)

    def _set(self, at: HookPoint, value: bool) -> None:
        unit = at.root.get_submodule(self.unit)
        if at.api is not None:
            unit.set_reshard_after_forward(value, recurse=False)
        elif at.utilities.set_reshard_after_forward is not None:
            at.utilities.set_reshard_after_forward(unit, value, recurse=False)
