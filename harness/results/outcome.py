"""What a cell ended with: the outcome part of its record (``harness.results.record.Record``
is the cell's plan, this, and its environment).

Whoever decides a cell's outcome builds one: the judge from the reference and the comparison
(``harness.rank.judging``), the blame of a failed or hung rank (``harness.rank.peers``), a skip
(``harness.rank.skips``), the launcher for a cell whose launch died or hung. It travels
between processes as JSON (``to_json`` / ``from_json``: a key it does not know is an error,
so a misspelt field cannot be dropped on the way to the record).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CellOutcome"]


@dataclass(kw_only=True)
class CellOutcome:
    """A cell's status and what explains it."""

    status: str
    #: why the expectation is what it is (the cell's own reason), or why the cell was skipped
    reason: str | None = None
    #: a skip the scenario does not declare: what this machine lacked (a package, GPUs); such a
    #: skip is not as documented (``run --allow-missing`` lets a local run exit 0 anyway)
    missing: str | None = None
    exc_type: str | None = None
    exc_msg: str | None = None
    failing_rank: int | None = None
    failed_ranks: list[int] | None = None
    rank_errors: dict[str, str] | None = None
    traceback: str | None = None
    log: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    worst: str | None = None
    diffs: list[dict[str, Any]] = field(default_factory=list)
    grad_norm: float | None = None
    ref_grad_norm: float | None = None
    reference_quirks: list[str] = field(default_factory=list)
    #: where the cell's reference came from when it was not computed for it: "this launch" (a cell
    #: before it produced the same tensors), "an earlier run" (kept, ``harness.train.reuse``)
    reference_from: str | None = None
    #: the scenario's collectives per step, micro-batch and phase (``harness.train.ledger``: rows of
    #: step, micro_batch, phase, kind, group, dtype, count, bytes); None where not recorded
    ledger: list[list[Any]] | None = None
    #: rank 0's live tensors after each step (``harness.train.resources``: step, tensors, bytes, cuda_allocated)
    resources: list[list[Any]] | None = None
    #: the patches' install outcomes (name -> status, reason)
    patch_install: dict[str, dict[str, str]] = field(default_factory=dict)
    #: process-wide state the cell left changed ("left the default dtype float64", "left a global
    #: module forward hook registered", "left torch.nn.functional.linear replaced":
    #: ``harness.rank.state``, ``harness.rank.leaks``); no later cell sees it (its own process, or
    #: put back); the report shows each as a caveat
    left_state: list[str] = field(default_factory=list)
    #: the torch functions, methods and classes the cell's patch set replaced or added (``harness.rank.leaks``)
    patch_changes: list[str] = field(default_factory=list)
    #: what the judge noticed beyond the verdict (a gloo reduction that summed where no quirk is
    #: declared: ``harness.rank.judging``); the report shows each
    findings: list[str] = field(default_factory=list)
    #: a documented mismatch's symptom (``Expect.symptom``): whether the judge saw it, and what it saw instead
    symptom_seen: bool | None = None
    symptom: str | None = None
    #: a fault injected on the FSDP2 side (``run --fault``, ``harness.train.faults``), the parameters
    #: whose step-0 grad it changed, and those of them no check flagged (the scenario's blind spots)
    fault: str | None = None
    fault_affected: list[str] = field(default_factory=list)
    fault_missed: list[str] = field(default_factory=list)
    #: a cell that installed patches: the code of the module under test that ran in it on any rank, id ->
    #: digest (``harness.undertest.code_ran``); a later run reuses the record while all of it hashes the same
    code_deps: dict[str, str] | None = None
    #: the judge's wall and CPU seconds per phase of the cell (``harness.rank.phases``: name -> [wall, cpu])
    phases: dict[str, list[float]] | None = None

    def update(self, **fields: Any) -> CellOutcome:
        """Set ``fields`` (names checked); returns self."""
        for key, value in fields.items():
            if key not in _NAMES:
                raise TypeError(f"CellOutcome has no field {key!r}")
            setattr(self, key, value)
        return self

    def to_json(self) -> dict[str, Any]:
        """The fields that differ from their defaults (JSON-ready)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CellOutcome)
                if getattr(self, f.name) != _DEFAULTS[f.name]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellOutcome:
        """``to_json``'s dict back; a key that is not a field is a ``ValueError``."""
        unknown = sorted(set(data) - _NAMES)
        if unknown:
            raise ValueError(f"not fields of a cell's outcome: {', '.join(unknown)}")
        return cls(**data)


_NAMES = frozenset(f.name for f in dataclasses.fields(CellOutcome))
_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
             for f in dataclasses.fields(CellOutcome) if f.name != "status"} | {"status": None}
