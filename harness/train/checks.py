"""Checks beyond values: what a cell must satisfy besides matching the reference.

A scenario lists its checks (``Scenario.checks``); every cell also runs ``ALWAYS``. The judge
(``harness.rank.judging``) runs them in order on a cell whose values matched: the first check
with problems makes it a ``mismatch``, its ``worst`` "<kind>: <problems>". A check that needs
the FSDP2 side to record something says so in ``measures`` (``"resources"``: rank 0 measures
what it holds after each step, ``harness.train.resources``); what is recorded anyway (the
collective ledger, how FSDP2 sharded the model) needs nothing.

A new kind of check is a class here with ``kind`` and ``problems``, and the scenarios that list
it; nothing else in the harness changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any, ClassVar

import torch

from harness.train.ledger import check_problems
from harness.train.resources import growth_problems
from harness.train.step import StepTensors

__all__ = ["ALWAYS", "Check", "GradDtype", "LedgerRules", "ResourceGrowth", "ShardingAsDeclared", "first_problem"]


class Check:
    """What a check is (a scenario lists instances)."""

    #: the word ``worst`` starts with ("ledger", "resources", "sharding")
    kind: ClassVar[str] = ""
    #: what the FSDP2 side must record for this check (``Scenario.measures``)
    measures: ClassVar[frozenset[str]] = frozenset()

    def problems(self, observed: list[StepTensors]) -> list[str]:
        """Problem texts in what FSDP2 produced (rank 0's snapshots, one per step); none: it holds."""
        raise NotImplementedError

    def worst(self, problems: list[str]) -> str:
        return f"{self.kind}: " + "; ".join(problems)


@dataclass(frozen=True, init=False)
class LedgerRules(Check):
    """Rules on the cell's collective ledger (``harness.train.ledger``: ``at_most(...)``); each
    rule returns a problem text or None."""

    rules: tuple[Callable[[Any], str | None], ...]
    kind: ClassVar[str] = "ledger"

    def __init__(self, *rules: Callable[[Any], str | None]) -> None:
        object.__setattr__(self, "rules", rules)

    def problems(self, observed: list[StepTensors]) -> list[str]:
        return check_problems(self.rules, observed[0].ledger if observed else None)


@dataclass(frozen=True)
class ResourceGrowth(Check):
    """What rank 0 holds after each step (live tensors, their bytes, CUDA memory) must not grow
    every step after the first (``harness.train.resources.growth_problems``)."""

    kind: ClassVar[str] = "resources"
    measures: ClassVar[frozenset[str]] = frozenset({"resources"})

    def problems(self, observed: list[StepTensors]) -> list[str]:
        return growth_problems(observed[0].resources if observed else None)


@dataclass(frozen=True)
class ShardingAsDeclared(Check):
    """FSDP2 sharded every parameter as the scenario declares (FSDP2 side, first snapshot)."""

    kind: ClassVar[str] = "sharding"
    #: problems named in ``worst`` before "(and N more)"
    shown: int = 3

    def problems(self, observed: list[StepTensors]) -> list[str]:
        return list(observed[0].sharding or []) if observed else []

    def worst(self, problems: list[str]) -> str:
        more = len(problems) - self.shown
        return f"{self.kind}: " + "; ".join(problems[:self.shown]) + (f" (and {more} more)" if more > 0 else "")


@dataclass(frozen=True)
class GradDtype(Check):
    """The grads FSDP2 hands out (after accumulation, before clipping) have ``dtype``: where a
    stack asks for grads in another dtype than the params' (``param.grad_dtype``), values that
    match the reference do not show a dtype that was dropped."""

    dtype: torch.dtype
    #: ``fnmatch`` patterns of the parameter names it applies to
    params: tuple[str, ...] = ("*",)
    kind: ClassVar[str] = "grad dtype"

    def problems(self, observed: list[StepTensors]) -> list[str]:
        return [f"{name} {str(g.dtype).removeprefix('torch.')} (wanted {str(self.dtype).removeprefix('torch.')})"
                for step in observed[:1] for name, g in step.grads.items()
                if g is not None and g.dtype != self.dtype and any(fnmatch(name, p) for p in self.params)]


#: the checks every cell runs after its scenario's own
ALWAYS: tuple[Check, ...] = (ShardingAsDeclared(),)


def first_problem(checks: tuple[Check, ...], observed: list[StepTensors]) -> str | None:
    """``worst`` of the first of ``checks`` (then ``ALWAYS``) with problems; None: all hold."""
    for check in (*checks, *ALWAYS):
        if problems := check.problems(observed):
            return check.worst(problems)
    return None
