"""Verdicts: what one vanilla/patched pair of records says about the patches.

A *cell* is one (scenario, torch, device, world_size) combination.  It has up
to two records: the ``vanilla`` run (stock torch) and the ``patched`` run
(the patches module installed).  Each record is reduced to an *outcome class*:

==========  =========  ========  ========  =================  ==============================================
#     kind       vanilla   patched   verdict            meaning
====  =========  ========  ========  =================  ==============================================
1     *          missing   missing   not run            nothing recorded
2     *          *         broken    patch broken       a patch failed to install
3     baseline   fail      fail      regression         baseline fails either way
4     *          *         fail      patch broken       patched fails unexpectedly
5     *          missing   *         not run            vanilla record missing
6     *          *         missing   not run            patched record missing
7     *          fail      pass      patch needed       patch fixes a failure
8     *          xfail     pass      patch needed       patch fixes a known failure
9     *          skip      pass      patch needed       patch backports a feature
10    patched    pass      pass      fixed upstream     vanilla works: retire it
11    baseline   pass      pass      ok                 baseline works
12    patched    pass      xfail     fixed upstream     vanilla works, patch documented not to
13    baseline   pass      xfail     expected failure   documented patched failure
14    *          xfail     xfail     expected failure   documented failures
15    *          fail      *         regression         vanilla fails unexpectedly, patched xfail/skip
16    *          *         *         n/a                skips (pass/xfail + skip)
====  =========  ========  ========  =================  ==============================================

"Unexpected" stays visible independently of the verdict: every record with
``as_expected`` false and every patch install error adds a note to
``CellVerdict.unexpected`` (e.g. "vanilla unexpectedly passes (expected
error)" hints at an upstream fix, "vanilla regression: error, expected pass").

Per-patch summary: each cell contributes a status for every patch its
scenario lists (``patch_contributions``): an install error of that patch ->
broken; a cell that is broken only through *another* patch's install error ->
not run; install "not-applicable" with vanilla passing -> retire; otherwise
``PATCH_STATUS_BY_VERDICT``.  An install error of any patch in any patched
record also counts as broken for that patch.  ``combine_patch_statuses``
keeps the strongest: broken > needed > retire > not applicable > not run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BASELINE",
    "EXPECTED_FAILURE",
    "FAILING_STATUSES",
    "FIXED_UPSTREAM",
    "NOT_APPLICABLE",
    "NOT_RUN",
    "OK",
    "PATCHED",
    "PATCH_BROKEN",
    "PATCH_NEEDED",
    "PATCH_STATUSES",
    "PATCH_STATUS_BY_VERDICT",
    "PS_BROKEN",
    "PS_NEEDED",
    "PS_NOT_APPLICABLE",
    "PS_NOT_RUN",
    "PS_RETIRE",
    "REGRESSION",
    "STATUSES",
    "VERDICTS",
    "VERDICT_RULES",
    "CellVerdict",
    "Record",
    "Rule",
    "combine_patch_statuses",
    "install_errors",
    "judge",
    "match_rule",
    "outcome",
    "patch_contributions",
    "scenario_kind",
    "unexpected_notes",
]

Record = Mapping[str, Any]

STATUSES: tuple[str, ...] = ("pass", "mismatch", "error", "hang", "crash", "skip")
FAILING_STATUSES: frozenset[str] = frozenset({"error", "mismatch", "hang", "crash"})

# Cell verdicts, most severe first (the order used for legends and counts).
PATCH_BROKEN = "patch broken"
REGRESSION = "regression"
PATCH_NEEDED = "patch needed"
FIXED_UPSTREAM = "fixed upstream"
EXPECTED_FAILURE = "expected failure"
OK = "ok"
NOT_APPLICABLE = "n/a"
NOT_RUN = "not run"
VERDICTS: tuple[str, ...] = (
    PATCH_BROKEN,
    REGRESSION,
    PATCH_NEEDED,
    FIXED_UPSTREAM,
    EXPECTED_FAILURE,
    OK,
    NOT_APPLICABLE,
    NOT_RUN,
)

# Scenario kinds.
PATCHED = "patched"
BASELINE = "baseline"

# Per-patch statuses, strongest first.
PS_BROKEN = "broken"
PS_NEEDED = "needed"
PS_RETIRE = "retire"
PS_NOT_APPLICABLE = "not applicable"
PS_NOT_RUN = "not run"
PATCH_STATUSES: tuple[str, ...] = (PS_BROKEN, PS_NEEDED, PS_RETIRE, PS_NOT_APPLICABLE, PS_NOT_RUN)

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
        return all(
            want in (ANY, got)
            for want, got in ((self.kind, kind), (self.vanilla, vanilla), (self.patched, patched))
        )


def _rule(number: int, kind: str, vanilla: str, patched: str, verdict: str, meaning: str) -> Rule:
    return Rule(
        number=number, kind=kind, vanilla=vanilla, patched=patched, verdict=verdict, meaning=meaning
    )


VERDICT_RULES: tuple[Rule, ...] = (
    _rule(1, ANY, "missing", "missing", NOT_RUN, "nothing recorded"),
    _rule(2, ANY, ANY, "broken", PATCH_BROKEN, "a patch failed to install"),
    _rule(3, BASELINE, "fail", "fail", REGRESSION, "baseline scenario fails with and without patches"),
    _rule(4, ANY, ANY, "fail", PATCH_BROKEN, "patched run fails unexpectedly"),
    _rule(5, ANY, "missing", ANY, NOT_RUN, "vanilla record missing"),
    _rule(6, ANY, ANY, "missing", NOT_RUN, "patched record missing"),
    _rule(7, ANY, "fail", "pass", PATCH_NEEDED, "the patch fixes a vanilla failure"),
    _rule(8, ANY, "xfail", "pass", PATCH_NEEDED, "the patch fixes a documented vanilla failure"),
    _rule(9, ANY, "skip", "pass", PATCH_NEEDED, "the patch backports a missing feature"),
    _rule(10, PATCHED, "pass", "pass", FIXED_UPSTREAM, "vanilla works: retire the patch"),
    _rule(11, BASELINE, "pass", "pass", OK, "baseline scenario works"),
    _rule(12, PATCHED, "pass", "xfail", FIXED_UPSTREAM, "vanilla works; patch documented not to"),
    _rule(13, BASELINE, "pass", "xfail", EXPECTED_FAILURE, "documented failure under the patches"),
    _rule(14, ANY, "xfail", "xfail", EXPECTED_FAILURE, "documented failures on both variants"),
    _rule(15, ANY, "fail", ANY, REGRESSION, "vanilla fails unexpectedly, patched gives no fix"),
    _rule(16, ANY, ANY, ANY, NOT_APPLICABLE, "skipped"),
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


def install_errors(record: Record | None) -> dict[str, str]:
    """Patch name -> reason for every ``patch_install`` entry with status "error"."""
    if record is None:
        return {}
    entries = record.get("patch_install") or {}
    return {
        name: str(entry.get("reason") or "")
        for name, entry in entries.items()
        if isinstance(entry, Mapping) and entry.get("status") == "error"
    }


def outcome(record: Record | None, *, variant: str) -> str:
    """Outcome class of one record (see the module docstring)."""
    if record is None:
        return "missing"
    if variant == "patched" and install_errors(record):
        return "broken"
    status = record["status"]
    if status in FAILING_STATUSES:
        return "xfail" if record.get("as_expected") else "fail"
    if status == "skip":
        return "skip"
    return "pass"


def scenario_kind(patches: Sequence[str]) -> str:
    return PATCHED if patches else BASELINE


def match_rule(*, kind: str, vanilla: str, patched: str) -> Rule:
    for rule in VERDICT_RULES:
        if rule.matches(kind=kind, vanilla=vanilla, patched=patched):
            return rule
    raise AssertionError(f"no verdict rule for {kind}/{vanilla}/{patched}")  # rule 16 is total


def _record_note(variant: str, record: Record) -> str | None:
    if record.get("as_expected", True):
        return None
    status, expected = record["status"], record.get("expected") or ""
    allowed = expected.split("|")  # "error|mismatch": any of these is as documented
    if status == "pass":
        return f"{variant} unexpectedly passes (expected {expected})"
    if allowed == ["pass"] and status in FAILING_STATUSES:
        return f"{variant} regression: {status}, expected pass"
    match = record.get("expected_match")
    if status in allowed and match:
        return f"{variant} {status} does not contain {match!r}"
    return f"{variant} {status}, expected {expected}"


def unexpected_notes(vanilla: Record | None, patched: Record | None) -> tuple[str, ...]:
    """Human-readable flags for results that differ from their documentation."""
    notes = [
        note
        for variant, record in (("vanilla", vanilla), ("patched", patched))
        if record is not None and (note := _record_note(variant, record)) is not None
    ]
    notes += [
        f"patch {name} install error" + (f": {reason}" if reason else "")
        for name, reason in sorted(install_errors(patched).items())
    ]
    return tuple(notes)


def _patches_of(*records: Record | None) -> tuple[str, ...]:
    return tuple(sorted({p for r in records if r is not None for p in r.get("patches") or ()}))


def judge(
    vanilla: Record | None,
    patched: Record | None,
    *,
    patches: Sequence[str] | None = None,
) -> CellVerdict:
    """Verdict for one cell; ``patches`` defaults to the union of the records' lists."""
    kind = scenario_kind(_patches_of(vanilla, patched) if patches is None else patches)
    if any(r is not None and r.get("bug_observable") is False for r in (vanilla, patched)):
        kind = BASELINE  # the bug cannot show on this device: a pass says nothing about the patch
    v_class = outcome(vanilla, variant="vanilla")
    p_class = outcome(patched, variant="patched")
    rule = match_rule(kind=kind, vanilla=v_class, patched=p_class)
    return CellVerdict(
        verdict=rule.verdict,
        kind=kind,
        vanilla=v_class,
        patched=p_class,
        rule=rule,
        unexpected=unexpected_notes(vanilla, patched),
    )


def _install_status(record: Record | None, patch: str) -> str | None:
    entry = ((record or {}).get("patch_install") or {}).get(patch)
    return entry.get("status") if isinstance(entry, Mapping) else None


def _patch_status(patch: str, cell: CellVerdict, errors: Mapping[str, str], patched: Record | None) -> str:
    if patch in errors:
        return PS_BROKEN
    if cell.patched == "broken":
        return PS_NOT_RUN  # broken by another patch's install error: says nothing about this one
    if cell.verdict != PATCH_BROKEN and cell.vanilla == "pass" and _install_status(patched, patch) == "not-applicable":
        return PS_RETIRE
    return PATCH_STATUS_BY_VERDICT[cell.verdict]


def patch_contributions(
    patches: Sequence[str],
    cell: CellVerdict,
    patched: Record | None,
) -> dict[str, str]:
    """Per-patch status this cell contributes, for its scenario's patches and install errors."""
    errors = install_errors(patched)
    names = sorted(set(patches) | set(errors))
    return {name: _patch_status(name, cell, errors, patched) for name in names}


def combine_patch_statuses(statuses: Iterable[str]) -> str:
    """Strongest status: broken > needed > retire > not applicable > not run."""
    present = set(statuses)
    return next((s for s in PATCH_STATUSES if s in present), PS_NOT_RUN)
