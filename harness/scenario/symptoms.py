"""Symptoms: what a documented silent failure must look like, checked on the numbers.

A scenario documents a silent bug as ``Expect(status="mismatch", symptom=...)``: a mismatch
is "as documented" only when the judge also sees the symptom (grads scaled by the shard
group's size, the named parameters and only those differing, grads missing), so a
different failure in the same cell is "not as documented" instead of passing for the bug.
A symptom gets the cell's ``Evidence`` and returns None when it sees itself, else what it
saw instead (one line).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Evidence", "Symptom", "differs_only", "from_step", "grads_scaled", "presence_lost"]


@dataclass(kw_only=True, frozen=True)
class Evidence:
    """What the judge has: FSDP2's and the reference's snapshots (``StepTensors``, per step),
    the comparison's diffs that failed, and the cell's world size."""

    observed: list[Any]
    reference: list[Any]
    failed: list[Any]
    world_size: int


#: a symptom check: None where the symptom is seen, else what was seen instead
Symptom = Callable[[Evidence], "str | None"]


def _names(failed: list[Any], kinds: tuple[str, ...]) -> set[str]:
    return {d.name for d in failed if d.kind in kinds}


def grads_scaled(factor: float | str, *, step: int = 0, rtol: float = 1e-3) -> Symptom:
    """Every grad of ``step`` is ``factor`` times the reference's (``"world_size"``: the cell's)."""

    def check(e: Evidence) -> str | None:
        k = float(e.world_size) if factor == "world_size" else float(factor)
        obs, ref = e.observed[step].grads, e.reference[step].grads
        off = []
        for name, r in ref.items():
            o = obs.get(name)
            if r is None or o is None or float(r.abs().max()) == 0:
                continue
            gap = float((o.double() - k * r.double()).abs().max() / (k * r.double()).abs().max())
            if gap > rtol:
                off.append(f"{name} ({gap:.2g} off)")
        return None if not off else f"grads not {k:g} times the reference's: {', '.join(off[:3])}"

    return check


def differs_only(*patterns: str, kinds: tuple[str, ...] = ("grad", "presence", "clipped")) -> Symptom:
    """Some parameter matching ``patterns`` (fnmatch) differs, and no other one does."""

    def check(e: Evidence) -> str | None:
        names = _names(e.failed, kinds)
        inside = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
        if not inside:
            return f"no {'/'.join(kinds)} difference in {', '.join(patterns)}"
        outside = sorted(names - inside)
        return None if not outside else f"also differs: {', '.join(outside[:3])}"

    return check


def presence_lost(*patterns: str) -> Symptom:
    """The parameters matching ``patterns`` have no grad where the reference has one."""

    def check(e: Evidence) -> str | None:
        lost = {d.name for d in e.failed if d.kind == "presence" and "observed None" in d.note}
        wanted = {n for n in e.reference[0].grads if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
        missing = sorted(wanted - lost)
        return None if lost and not missing else f"grads not lost for {', '.join(missing[:3]) or 'any parameter'}"

    return check


def from_step(step: int) -> Symptom:
    """The run departs from the reference at ``step``, not before."""

    def check(e: Evidence) -> str | None:
        first = min((d.step for d in e.failed), default=None)
        return None if first == step else f"first difference at step {first}, not {step}"

    return check
