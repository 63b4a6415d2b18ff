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

__all__ = ["Hook", "NeedsTorch", "ReduceAfterWindow", "WindowEnd"]


@dataclass(frozen=True, kw_only=True)
class WindowEnd:
    """What a hook sees after the last micro-batch of an accumulation window."""

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

    def end_window(self, at: WindowEnd) -> None:
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

    def end_window(self, at: WindowEnd) -> None:
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
