"""Verdicts: what one vanilla/patched pair of records says about the patches.

A *cell* is one (scenario, torch, device, world_size) combination with up to two
records, ``vanilla`` (stock torch) and ``patched`` (the patches installed). Each record
is reduced to an *outcome class* (``outcome``): missing, broken (a patch failed to
install), pass, xfail (a documented failure), fail (an undocumented one) or skip. The
first matching row of ``VERDICT_RULES`` gives the verdict.

"Unexpected" stays visible independently of the verdict: every record that is not as
expected and every patch install error adds a note to ``CellVerdict.unexpected``.

Per-patch summary: each cell contributes a status for every patch its scenario lists
(``patch_contributions``): an install error of that patch -> broken; a cell broken only
through *another* patch's install error -> not run; install "not-applicable" with
vanilla passing -> retire; otherwise ``PATCH_STATUS_BY_VERDICT``.
``combine_patch_statuses`` keeps the strongest (the order of ``PATCH_STATUSES``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from harness.names import (
    EXPECTED_FAILURE,
    FIXED_UPSTREAM,
    NOT_APPLICABLE,
    NOT_RUN,
    OK,
    PATCH_BROKEN,
    PATCH_NEEDED,
    PATCH_STATUSES,
    PS_BROKEN,
    PS_NEEDED,
    PS_NOT_APPLICABLE,
    PS_NOT_RUN,
    PS_RETIRE,
    REGRESSION,
    format_statuses,
)
from harness.record import Record

__all__ = [
    "BASELINE",
    "PATCHED",
    "PATCH_STATUS_BY_VERDICT",
    "VERDICT_RULES",
    "CellVerdict",
    "Rule",
    "combine_patch_statuses",
    "judge",
    "match_rule",
    "outcome",
    "patch_contributions",
    "unexpected_notes",
]

# Scenario kinds.
PATCHED = "patched"
BASELINE = "baseline"

PATCH_STATUS_BY_VERDICT: Mapping[str, str] = {
    PATCH_BROKEN: PS_BROKEN,
    PATCH_NEEDED: PS_NEEDED,
    FIXED_UPSTREAM: PS_RETIRE,
    REGRESSION: PS_NOT_APPLICABLE,
    EXPECTED_FAILURE: PS_NOT_APPLICABLE,
    OK: PS_NOT_APPLICABLE,
    NOT_APPLICABLE: PS_NOT_APPLICABLE,
    NOT_RUN: PS_NOT_RUN,
}

ANY = "*"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One row of the verdict table; ``*`` in a field matches anything."""

    number: int
    kind: str
    vanilla: str
    patched: str
    verdict: str
    meaning: str

    def matches(self, *, kind: str, vanilla: str, patched: str) -> bool:
        return all(want in (ANY, got) for want, got in ((self.kind, kind), (self.vanilla, vanilla), (self.patched, patched)))


def _rules(*rows: tuple[str, str, str, str, str]) -> tuple[Rule, ...]:
    return tuple(Rule(number=i, kind=k, vanilla=v, patched=p, verdict=verdict, meaning=m)
                 for i, (k, v, p, verdict, m) in enumerate(rows, start=1))


VERDICT_RULES: tuple[Rule, ...] = _rules(
    (ANY, "missing", "missing", NOT_RUN, "nothing recorded"),
    (ANY, ANY, "broken", PATCH_BROKEN, "a patch failed to install"),
    (BASELINE, "fail", "fail", REGRESSION, "baseline scenario fails with and without patches"),
    (ANY, ANY, "fail", PATCH_BROKEN, "patched run fails unexpectedly"),
    (ANY, "missing", ANY, NOT_RUN, "vanilla record missing"),
    (ANY, ANY, "missing", NOT_RUN, "patched record missing"),
    (ANY, "fail", "pass", PATCH_NEEDED, "the patch fixes a vanilla failure"),
    (ANY, "xfail", "pass", PATCH_NEEDED, "the patch fixes a documented vanilla failure"),
    (ANY, "skip", "pass", PATCH_NEEDED, "the patch backports a missing feature"),
    (PATCHED, "pass", "pass", FIXED_UPSTREAM, "vanilla works: retire the patch"),
    (BASELINE, "pass", "pass", OK, "baseline scenario works"),
    (PATCHED, "pass", "xfail", FIXED_UPSTREAM, "vanilla works; patch documented not to"),
    (BASELINE, "pass", "xfail", EXPECTED_FAILURE, "documented failure under the patches"),
    (ANY, "xfail", "xfail", EXPECTED_FAILURE, "documented failures on both variants"),
    (ANY, "fail", ANY, REGRESSION, "vanilla fails unexpectedly, patched gives no fix"),
    (ANY, ANY, ANY, NOT_APPLICABLE, "skipped"),
)


@dataclass(frozen=True, kw_only=True)
class CellVerdict:
    """The verdict for one cell plus the evidence it rests on."""

    verdict: str
    kind: str
    vanilla: str
    patched: str
    rule: Rule
    unexpected: tuple[str, ...] = ()

    @property
    def flagged(self) -> bool:
        return bool(self.unexpected)


def outcome(record: Record | None, *, variant: str) -> str:
    """Outcome class of one record (see the module docstring)."""
    if record is None:
        return "missing"
    if variant != "vanilla" and record.install_errors:
        return "broken"
    if record.failed:
        return "xfail" if record.as_expected else "fail"
    return "skip" if record.status == "skip" else "pass"


def match_rule(*, kind: str, vanilla: str, patched: str) -> Rule:
    for rule in VERDICT_RULES:
        if rule.matches(kind=kind, vanilla=vanilla, patched=patched):
            return rule
    raise AssertionError(f"no verdict rule for {kind}/{vanilla}/{patched}")  # the last rule is total


def _record_note(variant: str, record: Record) -> str | None:
    if record.as_expected:
        return None
    expected = format_statuses(record.expected)
    if record.status == "pass":
        return f"{variant} unexpectedly passes (expected {expected})"
    if record.expected == ("pass",) and record.failed:
        return f"{variant} regression: {record.status}, expected pass"
    if record.status in record.expected and record.expected_match:
        return f"{variant} {record.status} does not contain {record.expected_match!r}"
    return f"{variant} {record.status}, expected {expected}"


def unexpected_notes(vanilla: Record | None, patched: Record | None) -> tuple[str, ...]:
    """Human-readable flags for results that differ from their documentation."""
    notes = [note for variant, rec in (("vanilla", vanilla), ("patched", patched))
             if rec is not None and (note := _record_note(variant, rec)) is not None]
    errors = patched.install_errors if patched is not None else {}
    notes += [f"patch {name} install error" + (f": {reason}" if reason else "") for name, reason in sorted(errors.items())]
    return tuple(notes)


def judge(vanilla: Record | None, patched: Record | None, *, patches: Sequence[str] | None = None) -> CellVerdict:
    """Verdict for one cell; ``patches`` defaults to the union of the records' lists."""
    if patches is None:
        patches = sorted({p for r in (vanilla, patched) if r is not None for p in r.patches})
    kind = PATCHED if patches else BASELINE
    if any(r is not None and not r.bug_observable for r in (vanilla, patched)):
        kind = BASELINE  # the bug cannot show on this device: a pass says nothing about the patch
    v_class, p_class = outcome(vanilla, variant="vanilla"), outcome(patched, variant="patched")
    rule = match_rule(kind=kind, vanilla=v_class, patched=p_class)
    return CellVerdict(verdict=rule.verdict, kind=kind, vanilla=v_class, patched=p_class, rule=rule,
                       unexpected=unexpected_notes(vanilla, patched))


def _patch_status(patch: str, cell: CellVerdict, errors: Mapping[str, str], patched: Record | None) -> str:
    if patch in errors:
        return PS_BROKEN
    if cell.patched == "broken":
        return PS_NOT_RUN  # broken by another patch's install error: says nothing about this one
    install = (patched.patch_install.get(patch) or {}).get("status") if patched is not None else None
    if cell.verdict != PATCH_BROKEN and cell.vanilla == "pass" and install == "not-applicable":
        return PS_RETIRE
    return PATCH_STATUS_BY_VERDICT[cell.verdict]


def patch_contributions(patches: Sequence[str], cell: CellVerdict, patched: Record | None) -> dict[str, str]:
    """Per-patch status this cell contributes, for its scenario's patches and install errors."""
    errors = patched.install_errors if patched is not None else {}
    return {name: _patch_status(name, cell, errors, patched) for name in sorted(set(patches) | set(errors))}


def combine_patch_statuses(statuses: Iterable[str]) -> str:
    """Strongest status: broken > needed > retire > not applicable > not run."""
    present = set(statuses)
    return next((s for s in PATCH_STATUSES if s in present), PS_NOT_RUN)
