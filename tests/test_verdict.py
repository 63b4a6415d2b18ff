"""Table-driven tests for harness.verdict."""

from __future__ import annotations

import pytest

from harness.names import (
    EXPECTED_FAILURE,
    FIXED_UPSTREAM,
    NOT_APPLICABLE,
    NOT_RUN,
    OK,
    PATCH_BROKEN,
    PATCH_NEEDED,
    PS_BROKEN,
    PS_NEEDED,
    PS_NOT_APPLICABLE,
    PS_NOT_RUN,
    PS_RETIRE,
    REGRESSION,
    VERDICTS,
)
from harness.record import Record
from harness.verdict import (
    VERDICT_RULES,
    combine_patch_statuses,
    judge,
    match_rule,
    outcome,
    patch_contributions,
    unexpected_notes,
)
from tests.conftest import make_record

PATCHES = ["unused_param_reduction"]


def rec(
    status: str | None,
    *,
    variant: str = "vanilla",
    expected: str | None = None,
    patches: list[str] | None = None,
    install: dict[str, str] | None = None,
    expected_match: str | None = None,
    as_expected: bool | None = None,
    bug_observable: bool = True,
) -> Record | None:
    """A minimal record; ``expected`` defaults to ``status`` (as expected)."""
    if status is None:
        return None
    expected = status if expected is None else expected
    return make_record(
        variant=variant, status=status, expected=expected, expected_match=expected_match,
        as_expected=status == expected if as_expected is None else as_expected, bug_observable=bug_observable,
        patches=PATCHES if patches is None else patches,
        patch_install={name: {"status": st, "reason": f"{st} reason"} for name, st in (install or {}).items()},
    )


# vanilla (status, expected), patched (status, expected), patches, install map, verdict
CASES: list[tuple[str, tuple | None, tuple | None, list[str], dict[str, str], str]] = [
    ("nothing", None, None, PATCHES, {}, NOT_RUN),
    ("vanilla only", ("error", "error"), None, PATCHES, {}, NOT_RUN),
    ("patched only pass", None, ("pass", "pass"), PATCHES, {}, NOT_RUN),
    ("patched only, fails unexpectedly", None, ("mismatch", "pass"), PATCHES, {}, PATCH_BROKEN),
    ("needed: documented failure fixed", ("error", "error"), ("pass", "pass"), PATCHES, {}, PATCH_NEEDED),
    ("needed: regression fixed", ("mismatch", "pass"), ("pass", "pass"), PATCHES, {}, PATCH_NEEDED),
    ("needed: hang fixed", ("hang", "hang"), ("pass", "pass"), PATCHES, {}, PATCH_NEEDED),
    ("needed: backport of missing feature", ("skip", "skip"), ("pass", "pass"), PATCHES, {}, PATCH_NEEDED),
    ("fixed upstream", ("pass", "pass"), ("pass", "pass"), PATCHES, {}, FIXED_UPSTREAM),
    ("fixed upstream, vanilla unexpectedly passes", ("pass", "error"), ("pass", "pass"), PATCHES, {}, FIXED_UPSTREAM),
    ("fixed upstream, patch documented failing", ("pass", "pass"), ("error", "error"), PATCHES, {}, FIXED_UPSTREAM),
    ("broken: patched fails unexpectedly", ("error", "error"), ("mismatch", "pass"), PATCHES, {}, PATCH_BROKEN),
    ("broken: patch breaks working vanilla", ("pass", "pass"), ("crash", "pass"), PATCHES, {}, PATCH_BROKEN),
    ("broken: both regress", ("error", "pass"), ("error", "pass"), PATCHES, {}, PATCH_BROKEN),
    ("broken: install error beats pass", ("error", "error"), ("pass", "pass"), PATCHES,
     {"unused_param_reduction": "error"}, PATCH_BROKEN),
    ("broken: install error, vanilla missing", None, ("pass", "pass"), PATCHES,
     {"unused_param_reduction": "error"}, PATCH_BROKEN),
    ("baseline ok", ("pass", "pass"), ("pass", "pass"), [], {}, OK),
    ("baseline broken by patches", ("pass", "pass"), ("error", "pass"), [], {}, PATCH_BROKEN),
    ("baseline regression", ("error", "pass"), ("error", "pass"), [], {}, REGRESSION),
    ("baseline documented failure under patches", ("pass", "pass"), ("error", "error"), [], {}, EXPECTED_FAILURE),
    ("baseline fixed by patches", ("error", "error"), ("pass", "pass"), [], {}, PATCH_NEEDED),
    ("expected failure both", ("error", "error"), ("error", "error"), PATCHES, {}, EXPECTED_FAILURE),
    ("expected failure baseline", ("mismatch", "mismatch"), ("mismatch", "mismatch"), [], {}, EXPECTED_FAILURE),
    ("regression, patched documented", ("error", "pass"), ("error", "error"), PATCHES, {}, REGRESSION),
    ("regression, patched skipped", ("hang", "pass"), ("skip", "skip"), PATCHES, {}, REGRESSION),
    ("n/a both skip", ("skip", "skip"), ("skip", "skip"), PATCHES, {}, NOT_APPLICABLE),
    ("n/a patched skip", ("pass", "pass"), ("skip", "skip"), PATCHES, {}, NOT_APPLICABLE),
    ("n/a vanilla skip, patched documented fail", ("skip", "skip"), ("error", "error"), PATCHES, {}, NOT_APPLICABLE),
    ("n/a baseline skips", ("skip", "skip"), ("skip", "skip"), [], {}, NOT_APPLICABLE),
]


@pytest.mark.parametrize(("name", "vanilla", "patched", "patches", "install", "verdict"), CASES, ids=[c[0] for c in CASES])
def test_verdict_table(name, vanilla, patched, patches, install, verdict) -> None:
    v = rec(*vanilla[:1], expected=vanilla[1], patches=patches) if vanilla else None
    p = rec(*patched[:1], variant="patched", expected=patched[1], patches=patches, install=install) if patched else None
    cell = judge(v, p, patches=patches)
    assert cell.verdict == verdict, f"{name}: rule {cell.rule.number} ({cell.vanilla}/{cell.patched})"
    assert cell.kind == ("patched" if patches else "baseline")
    if v is not None or p is not None:  # without ``patches`` the kind comes from the records
        assert judge(v, p) == cell


def test_every_rule_is_reachable_and_table_is_total() -> None:
    classes = ("pass", "fail", "xfail", "skip", "missing")
    used = {
        match_rule(kind=kind, vanilla=v, patched=p).number
        for kind in ("patched", "baseline")
        for v in classes
        for p in (*classes, "broken")
    }
    assert used == {r.number for r in VERDICT_RULES}
    assert {r.verdict for r in VERDICT_RULES} == set(VERDICTS)
    assert [r.number for r in VERDICT_RULES] == list(range(1, len(VERDICT_RULES) + 1))


@pytest.mark.parametrize(
    ("record", "variant", "expected"),
    [
        (None, "vanilla", "missing"),
        (rec("pass"), "vanilla", "pass"),
        (rec("pass", expected="error"), "vanilla", "pass"),
        (rec("error"), "vanilla", "xfail"),
        (rec("error", expected="pass"), "vanilla", "fail"),
        (rec("hang", expected="error"), "vanilla", "fail"),
        (rec("skip"), "patched", "skip"),
        (rec("pass", variant="patched", install={"x": "error"}), "patched", "broken"),
        (rec("pass", variant="patched", install={"x": "not-applicable"}), "patched", "pass"),
    ],
)
def test_outcome(record, variant, expected) -> None:
    assert outcome(record, variant=variant) == expected


@pytest.mark.parametrize(
    ("vanilla", "patched", "notes"),
    [
        (rec("pass"), rec("pass", variant="patched"), ()),
        (rec("pass", expected="error"), rec("pass", variant="patched"),
         ("vanilla unexpectedly passes (expected error)",)),
        (rec("error", expected="pass"), None, ("vanilla regression: error, expected pass",)),
        (rec("error"), rec("mismatch", variant="patched", expected="pass"),
         ("patched regression: mismatch, expected pass",)),
        (rec("hang", expected="error"), None, ("vanilla hang, expected error",)),
        (rec("hang", expected="error|mismatch"), None, ("vanilla hang, expected error|mismatch",)),
        (rec("error", expected="pass|mismatch"), None, ("vanilla error, expected pass|mismatch",)),
        (rec("pass", expected="error|mismatch"), None, ("vanilla unexpectedly passes (expected error|mismatch)",)),
        (rec("mismatch", expected="error|mismatch", expected_match="grad", as_expected=False), None,
         ("vanilla mismatch does not contain 'grad'",)),
        (rec("error", expected_match="no attribute", as_expected=False), None,
         ("vanilla error does not contain 'no attribute'",)),
        (None, rec("pass", variant="patched", install={"b": "error", "a": "installed"}),
         ("patch b install error: error reason",)),
    ],
)
def test_unexpected_notes(vanilla, patched, notes) -> None:
    assert unexpected_notes(vanilla, patched) == notes
    assert judge(vanilla, patched).flagged == bool(notes)


@pytest.mark.parametrize(
    ("vanilla", "patched", "patches", "contrib"),
    [
        (rec("error"), rec("pass", variant="patched"), PATCHES, {"unused_param_reduction": PS_NEEDED}),
        (rec("pass"), rec("pass", variant="patched"), PATCHES, {"unused_param_reduction": PS_RETIRE}),
        (rec("pass"), rec("pass", variant="patched", install={"unused_param_reduction": "not-applicable"}),
         PATCHES, {"unused_param_reduction": PS_RETIRE}),
        # not-applicable install but the patched run breaks: broken wins over retire
        (rec("pass"), rec("error", variant="patched", expected="pass",
                          install={"unused_param_reduction": "not-applicable"}),
         PATCHES, {"unused_param_reduction": PS_BROKEN}),
        (rec("error"), rec("error", variant="patched"), PATCHES, {"unused_param_reduction": PS_NOT_APPLICABLE}),
        (rec("skip"), rec("skip", variant="patched"), PATCHES, {"unused_param_reduction": PS_NOT_APPLICABLE}),
        (rec("error"), None, PATCHES, {"unused_param_reduction": PS_NOT_RUN}),
        # install error of one patch: it is broken, the other listed patch learns nothing
        (rec("error"), rec("pass", variant="patched", patches=["a", "b"], install={"a": "error"}),
         ["a", "b"], {"a": PS_BROKEN, "b": PS_NOT_RUN}),
        # install error of a patch the baseline scenario does not list still counts against it
        (rec("pass"), rec("pass", variant="patched", patches=[], install={"z": "error"}), [], {"z": PS_BROKEN}),
        (rec("pass", patches=[]), rec("pass", variant="patched", patches=[]), [], {}),
    ],
)
def test_patch_contributions(vanilla, patched, patches, contrib) -> None:
    assert patch_contributions(patches, judge(vanilla, patched, patches=patches), patched) == contrib


@pytest.mark.parametrize(
    ("statuses", "combined"),
    [
        ([], PS_NOT_RUN),
        ([PS_NOT_RUN], PS_NOT_RUN),
        ([PS_NOT_RUN, PS_NOT_APPLICABLE], PS_NOT_APPLICABLE),
        ([PS_RETIRE, PS_NOT_APPLICABLE, PS_NOT_RUN], PS_RETIRE),
        ([PS_RETIRE, PS_NEEDED], PS_NEEDED),
        ([PS_NEEDED, PS_BROKEN, PS_RETIRE], PS_BROKEN),
    ],
)
def test_combine_patch_statuses(statuses, combined) -> None:
    assert combine_patch_statuses(statuses) == combined


def test_a_bug_that_cannot_show_on_the_device_is_ok_not_fixed_upstream():
    seen = rec("pass", patches=["scale_grads"])
    assert judge(seen, rec("pass", variant="patched", patches=["scale_grads"])).verdict == FIXED_UPSTREAM
    hidden = rec("pass", patches=["scale_grads"], bug_observable=False)
    assert judge(hidden, rec("pass", variant="patched", patches=["scale_grads"], bug_observable=False)).verdict == OK
