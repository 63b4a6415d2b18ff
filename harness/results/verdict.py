"""Verdicts: what the records of one cell say about the patches, and what each patch's
maintainer should do with it.

A *cell* is one (scenario, torch, device, world size) with up to four records, one per
variant: ``vanilla`` (stock torch), ``patched`` (the scenario's own patches), ``deployed``
(every patch of the module, as users ship them) and ``api`` (stock torch with the public
API that replaces the scenario's patch). Each record is reduced to an *outcome class*
(``outcome``); the first matching row of ``VERDICT_RULES`` gives the cell's verdict. A
scenario without patches (a baseline), or whose bug cannot show on the device, is judged
on vanilla and deployed alone.

Per patch (``patch_contributions``), a cell contributes what it shows about each patch:
an install error -> broken; no such function in the module -> not provided; a documented
vanilla failure that the patched run fixes -> needed for the patch that fixes it
(``Expect.fixed_by``; every patch of the scenario when none is named), or "use public
API" where the ``api`` variant fixes it too and the API replaces that patch; a vanilla
run that lacks the feature (skip) -> backport; vanilla passing, or the patch finding its
target gone (install "not-applicable") -> retire. ``combine_patch_statuses`` keeps the
strongest, in the order of ``PATCH_STATUSES``.

Caveats stay visible beside the verdict: a patch set that turns a vanilla error into a
hang or a crash, records that are not as documented, and install errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.results.record import Record
from harness.results.safe import portable
from harness.vocabulary import (
    BACKPORT,
    DEPLOYED_BROKEN,
    EXPECTED_FAILURE,
    FIXED_UPSTREAM,
    NOT_APPLICABLE,
    NOT_PROVIDED,
    NOT_RUN,
    OK,
    PATCH_BROKEN,
    PATCH_NEEDED,
    PATCH_STATUSES,
    PS_API,
    PS_BACKPORT,
    PS_BROKEN,
    PS_NEEDED,
    PS_NOT_APPLICABLE,
    PS_NOT_PROVIDED,
    PS_NOT_RUN,
    PS_RETIRE,
    REGRESSION,
    UPSTREAM_BUG,
    USE_API,
    VARIANTS,
    Outcome,
    format_statuses,
    match_for,
)

__all__ = [
    "BASELINE",
    "PATCHED",
    "VERDICT_RULES",
    "CellVerdict",
    "Rule",
    "adjusted",
    "caveats",
    "combine_patch_statuses",
    "verdict_of",
    "match_rule",
    "outcome",
    "patch_contributions",
    "rule_rows",
    "unexpected_notes",
]

PATCHED = "patched"
BASELINE = "baseline"
ANY = "*"
FAILED = "fail|xfail|upstream"

Records = Mapping[str, "Record | None"]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One row of the verdict table: each field is ``*`` or alternatives joined by ``|``."""

    number: int
    kind: str
    vanilla: str
    patched: str
    deployed: str
    api: str
    verdict: str
    meaning: str

    def __post_init__(self) -> None:
        bad = [(v, w) for v in VARIANTS for w in getattr(self, v).split("|") if w != ANY and w not in set(Outcome)]
        if bad:
            raise ValueError(f"verdict rule {self.number}: {bad[0][0]} {bad[0][1]!r} is not an outcome class")

    def matches(self, kind: str, classes: Mapping[str, str]) -> bool:
        wanted = {"kind": self.kind, **{v: getattr(self, v) for v in VARIANTS}}
        got = {"kind": kind, **classes}
        return all(w == ANY or got[k] in w.split("|") for k, w in wanted.items())


def _rules(*rows: tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(Rule(number=i, kind=k, vanilla=v, patched=p, deployed=d, api=a, verdict=verdict, meaning=m)
                 for i, (k, v, p, d, a, verdict, m) in enumerate(rows, start=1))


#: kind, vanilla, patched, deployed, api -> verdict, over outcome classes (``Outcome``).
VERDICT_RULES: tuple[Rule, ...] = _rules(
    (ANY, "missing", "missing", "missing", ANY, NOT_RUN, "nothing recorded"),
    (PATCHED, ANY, "broken", ANY, ANY, PATCH_BROKEN, "a patch of the scenario failed to install"),
    (PATCHED, ANY, "not-provided", ANY, ANY, NOT_PROVIDED, "the module has no function for a patch of the scenario"),
    (PATCHED, ANY, "fail", ANY, ANY, PATCH_BROKEN, "the scenario's patches fail where they should pass"),
    (ANY, ANY, ANY, "broken", ANY, DEPLOYED_BROKEN, "a patch of the module failed to install"),
    (BASELINE, "fail", ANY, "fail", ANY, REGRESSION, "fails with and without the patches"),
    (ANY, ANY, ANY, "fail", ANY, DEPLOYED_BROKEN, "every patch installed together fails where it should pass"),
    (ANY, "missing", ANY, ANY, ANY, NOT_RUN, "vanilla record missing"),
    (PATCHED, ANY, "missing", ANY, ANY, NOT_RUN, "patched record missing"),
    (BASELINE, ANY, ANY, "missing", ANY, NOT_RUN, "deployed record missing"),
    (PATCHED, FAILED, "pass", ANY, "pass", USE_API, "the patch fixes it, and so does torch's public API"),
    (PATCHED, FAILED, "pass", ANY, ANY, PATCH_NEEDED, "the patch fixes a vanilla failure"),
    (PATCHED, "skip", "pass", ANY, ANY, BACKPORT, "vanilla lacks the feature the recipe uses; the patches provide it"),
    (PATCHED, "pass", "pass|xfail", ANY, ANY, FIXED_UPSTREAM, "vanilla works: retire the patch"),
    (BASELINE, FAILED, ANY, "pass", ANY, PATCH_NEEDED, "the patches fix a failure of plain training"),
    (BASELINE, "pass", ANY, "pass", ANY, OK, "works with and without the patches"),
    (BASELINE, "pass", ANY, "xfail", ANY, EXPECTED_FAILURE, "documented failure under the patches"),
    (ANY, "upstream", "xfail|upstream|missing", "xfail|upstream|skip|missing", ANY, UPSTREAM_BUG,
     "a documented upstream bug that no patch fixes"),
    (ANY, "xfail", "xfail|upstream|missing", "xfail|upstream|skip|missing", ANY, EXPECTED_FAILURE,
     "documented failures"),
    (PATCHED, "skip", "xfail|upstream", ANY, ANY, EXPECTED_FAILURE,
     "vanilla lacks the feature; the patched run fails as documented"),
    (ANY, "fail", ANY, ANY, ANY, REGRESSION, "vanilla fails unexpectedly and nothing fixes it"),
    (ANY, ANY, ANY, ANY, ANY, NOT_APPLICABLE, "skipped"),
)


@dataclass(frozen=True, kw_only=True)
class CellVerdict:
    """The verdict for one cell plus the evidence it rests on."""

    verdict: str
    kind: str
    classes: dict[str, str]
    rule: Rule
    unexpected: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()

    @property
    def flagged(self) -> bool:
        return bool(self.unexpected)


def outcome(record: Record | None, *, variant: str) -> Outcome:
    """Outcome class of one record (see ``VERDICT_RULES``)."""
    if record is None:
        return Outcome.MISSING
    if variant != "vanilla" and record.install_errors:
        return Outcome.BROKEN
    if variant == "patched" and any(e.get("status") == "not-provided" for n, e in record.patch_install.items()
                                    if n in record.patches):
        return Outcome.NOT_PROVIDED
    if record.failed:
        return (Outcome.UPSTREAM if record.upstream else Outcome.XFAIL) if record.as_expected else Outcome.FAIL
    return Outcome.SKIP if record.status == "skip" else Outcome.PASS


def match_rule(kind: str, classes: Mapping[str, str]) -> Rule:
    for rule in VERDICT_RULES:
        if rule.matches(kind, classes):
            return rule
    raise AssertionError(f"no verdict rule for {kind}/{classes}")  # the last rule is total


def _record_note(variant: str, record: Record) -> str | None:
    if record.as_expected:
        return None
    expected = format_statuses(record.expected)
    if record.status == "pass":
        return f"{variant} unexpectedly passes (expected {expected})"
    if record.expected == ("pass",) and record.failed:
        return f"{variant} regression: {record.status}, expected pass"
    if record.status == "mismatch" and record.symptom_seen is False:
        return f"{variant} mismatch without its documented symptom: {record.symptom}"
    if record.status in record.expected and (needle := match_for(record.expected_match, record.status)):
        return f"{variant} {record.status} does not contain {needle!r}"
    return f"{variant} {record.status}, expected {expected}"


def unexpected_notes(records: Records) -> tuple[str, ...]:
    """Human-readable flags for results that differ from their documentation."""
    notes = [note for variant, rec in records.items() if rec is not None and (note := _record_note(variant, rec))]
    for variant in ("patched", "deployed"):
        rec = records.get(variant)
        for name, reason in sorted((rec.install_errors if rec is not None else {}).items()):
            notes.append(f"{variant}: patch {name} install error" + (f": {reason}" if reason else ""))
    return tuple(dict.fromkeys(notes))


def caveats(records: Records) -> tuple[str, ...]:
    """A patch set that turns a vanilla error into a hang or crash (the fix costs the timeout),
    process-wide state a variant's run left changed ("vanilla, patched left the default
    dtype float64": the harness put it back, but the scenario leaks it where it runs), torch
    functions a patch set replaced outside ``torch.distributed`` (they change more than FSDP2),
    and the judge's findings (a gloo reduction that summed where no quirk is declared)."""
    out: list[str] = []
    vanilla = records.get("vanilla")
    if vanilla is not None and vanilla.status == "error":
        out += [f"{variant} turns vanilla's error into a {rec.status}" for variant in ("patched", "deployed")
                if (rec := records.get(variant)) is not None and rec.status in ("hang", "crash")]
    said: dict[str, list[str]] = {}
    for variant, rec in records.items():
        outside = [n for n in rec.patch_changes if not n.startswith("torch.distributed.")] if rec is not None else []
        texts = [*(rec.left_state if rec is not None else ()), *(rec.findings if rec is not None else ())]
        if outside:
            texts.append(f"patch set replaced {', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''} "
                         "(outside torch.distributed)")
        for text in texts:
            said.setdefault(text, []).append(variant)
    out += [f"{', '.join(variants)} {text}" for text, variants in said.items()]
    return tuple(out)


def adjusted(records: Records) -> str:
    """Each quirk the reference modelled, with the variants it modelled it for ("vanilla: ...")."""
    by_quirk: dict[str, list[str]] = {}
    for variant, rec in records.items():
        for quirk in rec.reference_quirks if rec is not None else ():
            by_quirk.setdefault(quirk, []).append(variant)
    return "; ".join(f"{', '.join(variants)}: {quirk}" for quirk, variants in sorted(by_quirk.items()))


def verdict_of(records: Records) -> CellVerdict:
    """Verdict for one cell from its records by variant (missing variants count as missing)."""
    present = [r for r in records.values() if r is not None]
    patches = sorted({p for r in present for p in r.patches})
    kind = PATCHED if patches and all(r.bug_observable for r in present) else BASELINE
    classes = {v: outcome(records.get(v), variant=v) for v in VARIANTS}
    rule = match_rule(kind, classes)
    return CellVerdict(verdict=rule.verdict, kind=kind, classes=classes, rule=rule,
                       unexpected=unexpected_notes(records), caveats=caveats(records))


def patch_contributions(cell: CellVerdict, records: Records) -> dict[str, tuple[str, str]]:
    """Patch -> (status, why) for what this cell shows about each patch it involves."""
    present = {v: r for v, r in records.items() if r is not None}
    out: dict[str, tuple[str, str]] = {}
    for variant, rec in present.items():
        for name, entry in rec.patch_install.items():
            if entry.get("status") == "error":
                out[name] = (PS_BROKEN, f"{variant} install error: {entry.get('reason', '')}")
            elif entry.get("status") == "not-provided" and name not in out:
                out[name] = (PS_NOT_PROVIDED, entry.get("reason", ""))
    patched, vanilla, api = present.get("patched"), present.get("vanilla"), present.get("api")
    if any(not r.bug_observable for r in present.values()):
        hidden = sorted({p for r in present.values() for p in r.patches} - set(out))
        return out | {name: (PS_NOT_APPLICABLE, "its bug cannot show on this device") for name in hidden}
    if patched is None or cell.kind != PATCHED:
        return out
    if cell.verdict == NOT_PROVIDED or patched.install_errors:
        return out  # the set did not run as a whole: this cell says nothing about the other patches
    fixed = [vanilla.fixed_by] if vanilla is not None and vanilla.fixed_by else list(patched.patches)
    for name in patched.patches:
        if name in out:
            continue
        install = patched.patch_install.get(name) or {}
        if install.get("status") == "not-applicable" and cell.verdict != PATCH_BROKEN:
            out[name] = (PS_RETIRE, f"the patch found its target gone: {portable(install.get('reason', ''))}")
        elif (status := _status_from_cell(cell.verdict, name, fixed, api)) is not None:
            out[name] = (status, cell.rule.meaning)
    return out


def _status_from_cell(verdict: str, name: str, fixed: list[str], api: Record | None) -> str | None:
    if verdict == PATCH_BROKEN:
        return PS_BROKEN
    if verdict in (USE_API, PATCH_NEEDED):
        if name not in fixed:
            return None  # this cell's failure is another patch's business
        return PS_API if verdict == USE_API and api is not None and name in api.api_replaces else PS_NEEDED
    return {BACKPORT: PS_BACKPORT, FIXED_UPSTREAM: PS_RETIRE, NOT_RUN: PS_NOT_RUN}.get(verdict, PS_NOT_APPLICABLE)


def combine_patch_statuses(statuses: Iterable[str]) -> str:
    """The strongest status, in the order of ``PATCH_STATUSES``."""
    present = set(statuses)
    return next((s for s in PATCH_STATUSES if s in present), PS_NOT_RUN)


def rule_rows() -> list[dict[str, object]]:
    """The verdict rules as table rows, in the order they are tried (the report's last table)."""
    return [{"#": r.number, "kind": r.kind, "vanilla": r.vanilla, "patched": r.patched, "deployed": r.deployed,
             "api": r.api, "verdict": r.verdict, "meaning": r.meaning} for r in VERDICT_RULES]
