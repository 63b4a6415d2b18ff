"""Table-driven tests for harness.results.verdict: cell verdicts from the four variants, per-patch
statuses a maintainer acts on, caveats and unexpected notes."""

from __future__ import annotations

import itertools

import pytest

from harness.results.record import Record
from harness.results.verdict import (
    VERDICT_RULES,
    caveats,
    combine_patch_statuses,
    match_rule,
    outcome,
    patch_contributions,
    unexpected_notes,
    verdict_of,
)
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
    VERDICTS,
)
from tests.support import make_record

A, B, E = "unused_param_reduction", "uniform_reduce_dtype", "restore_unused_param_grads"


def rec(status: str | None, variant: str = "vanilla", *, expected: str | None = None, patches=(A,),
        install: dict[str, str] | None = None, **extra) -> Record | None:
    """A record; ``expected`` defaults to ``status`` (as expected)."""
    if status is None:
        return None
    return make_record(variant=variant, status=status, expected=expected or status, patches=list(patches),
                       patch_install={n: {"status": s, "reason": f"{s} reason"} for n, s in (install or {}).items()},
                       **extra)


def cell(v=None, p=None, d=None, a=None, *, patches=(A,), **kw):
    """Records by variant from (status, expected) pairs, or a status alone (as expected)."""
    out = {}
    for variant, spec in zip(VARIANTS, (v, p, d, a)):
        if spec is None:
            out[variant] = None
            continue
        status, expected = spec if isinstance(spec, tuple) else (spec, spec)
        out[variant] = rec(status, variant, expected=expected, patches=patches, **kw.get(variant, {}))
    return out


CASES = [
    ("nothing", cell(), NOT_RUN),
    ("needed", cell("error", "pass", "pass"), PATCH_NEEDED),
    ("needed: undocumented vanilla failure", cell(("mismatch", "pass"), "pass", "pass"), PATCH_NEEDED),
    ("public API fixes it too", cell("crash", "pass", "pass", "pass"), USE_API),
    ("API absent on this torch", cell("crash", "pass", "pass", "skip"), PATCH_NEEDED),
    ("API does not fix it", cell("crash", "pass", "pass", ("crash", "pass")), PATCH_NEEDED),
    ("backport", cell("skip", "pass", "pass"), BACKPORT),
    ("fixed upstream", cell("pass", "pass", "pass"), FIXED_UPSTREAM),
    ("fixed upstream, vanilla was documented failing", cell(("pass", "error"), "pass", "pass"), FIXED_UPSTREAM),
    ("patch broken", cell("error", ("mismatch", "pass"), "pass"), PATCH_BROKEN),
    ("patch breaks working vanilla", cell("pass", ("crash", "pass"), "pass"), PATCH_BROKEN),
    ("install error", cell("error", "pass", "pass", patched={"install": {A: "error"}}), PATCH_BROKEN),
    ("not provided", cell("error", ("error", "pass"), "pass", patched={"install": {A: "not-provided"}}), NOT_PROVIDED),
    ("deployed set breaks it", cell("error", "pass", ("mismatch", "pass")), DEPLOYED_BROKEN),
    ("deployed install error", cell("pass", "pass", "pass", deployed={"install": {"z": "error"}}), DEPLOYED_BROKEN),
    ("expected failures", cell("error", "hang", "hang"), EXPECTED_FAILURE),
    ("regression", cell(("error", "pass"), ("error", "error"), ("error", "error")), REGRESSION),
    ("vanilla missing", cell(None, "pass", "pass"), NOT_RUN),
    ("patched missing", cell("error", None, "pass"), NOT_RUN),
    ("skips", cell("skip", "skip", "skip"), NOT_APPLICABLE),
    ("baseline ok", cell("pass", None, "pass", patches=()), OK),
    ("baseline broken by the patches", cell("pass", None, ("error", "pass"), patches=()), DEPLOYED_BROKEN),
    ("baseline regression", cell(("error", "pass"), None, ("error", "pass"), patches=()), REGRESSION),
    ("baseline deployed missing", cell("pass", None, None, patches=()), NOT_RUN),
    ("baseline documented failure under the patches", cell("pass", None, "error", patches=()), EXPECTED_FAILURE),
    ("upstream bug", cell("mismatch", None, "mismatch", patches=(), vanilla={"upstream": "pytorch/pytorch#1"},
                          deployed={"upstream": "pytorch/pytorch#1"}), UPSTREAM_BUG),
]


@pytest.mark.parametrize(("name", "records", "verdict"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(name, records, verdict):
    got = verdict_of(records)
    assert got.verdict == verdict, f"{name}: rule {got.rule.number} {got.classes}"


def test_a_bug_that_cannot_show_on_the_device_is_judged_like_a_baseline():
    hidden = {"vanilla": {"bug_observable": False}, "patched": {"bug_observable": False},
              "deployed": {"bug_observable": False}}
    got = verdict_of(cell("pass", "pass", "pass", **hidden))
    assert (got.kind, got.verdict) == ("baseline", OK)
    contrib = patch_contributions(got, cell("pass", "pass", "pass", **hidden))
    assert contrib == {A: (PS_NOT_APPLICABLE, "its bug cannot show on this device")}


def test_every_rule_is_reachable_and_the_table_is_total():
    classes = ("pass", "fail", "xfail", "upstream", "skip", "missing", "broken", "not-provided")
    used = {match_rule(kind, dict(zip(VARIANTS, combo))).number
            for kind in ("patched", "baseline") for combo in itertools.product(classes, repeat=4)}
    assert used == {r.number for r in VERDICT_RULES}
    assert {r.verdict for r in VERDICT_RULES} == set(VERDICTS)


@pytest.mark.parametrize(("record", "variant", "expected"), [
    (None, "vanilla", "missing"),
    (rec("pass"), "vanilla", "pass"),
    (rec("error"), "vanilla", "xfail"),
    (rec("mismatch", upstream="pytorch/pytorch#1"), "vanilla", "upstream"),
    (rec("error", expected="pass"), "vanilla", "fail"),
    (rec("skip"), "patched", "skip"),
    (rec("pass", "patched", install={A: "error"}), "patched", "broken"),
    (rec("pass", "patched", install={A: "not-provided"}), "patched", "not-provided"),
    (rec("pass", "deployed", install={"other": "not-provided"}), "deployed", "pass"),
    (rec("pass", "patched", install={A: "not-applicable"}), "patched", "pass"),
])
def test_outcome(record, variant, expected):
    assert outcome(record, variant=variant) == expected


def _contrib(records):
    return {k: s for k, (s, _) in patch_contributions(verdict_of(records), records).items()}


@pytest.mark.parametrize(("records", "expected"), [
    (cell("error", "pass", "pass"), {A: PS_NEEDED}),
    (cell("crash", "pass", "pass", ("pass", "pass"), api={"api_replaces": [A]}), {A: PS_API}),
    (cell("crash", "pass", "pass", "pass", api={"api_replaces": ["other"]}), {A: PS_NEEDED}),
    (cell("skip", "pass", "pass"), {A: PS_BACKPORT}),
    (cell("pass", "pass", "pass"), {A: PS_RETIRE}),
    # the failure is B's to fix (Expect.fixed_by): A and E learn nothing from this cell
    (cell("error", "pass", "pass", patches=(A, B, E), vanilla={"fixed_by": B}), {B: PS_NEEDED}),
    # B found its target gone: retire it, even though the cell needed E
    (cell("mismatch", "pass", "pass", patches=(A, B, E), vanilla={"fixed_by": E},
          patched={"install": {A: "installed", B: "not-applicable", E: "installed"}}), {B: PS_RETIRE, E: PS_NEEDED}),
    (cell("error", ("mismatch", "pass"), "pass"), {A: PS_BROKEN}),
    (cell("error", "pass", "pass", patches=(A, B), patched={"install": {A: "error"}}), {A: PS_BROKEN}),
    (cell("error", "error", "error", patches=(A, B), patched={"install": {B: "not-provided"}}), {B: PS_NOT_PROVIDED}),
    (cell("error", "hang", "hang"), {A: PS_NOT_APPLICABLE}),
    (cell("error", None, "pass"), {}),
    # deployed install errors count against that patch wherever they happen
    (cell("pass", None, "pass", patches=(), deployed={"install": {"z": "error"}}), {"z": PS_BROKEN}),
])
def test_patch_contributions(records, expected):
    assert _contrib(records) == expected


def test_a_target_gone_names_the_file_from_its_package_on_not_the_machines_folders():
    records = cell("error", "pass", "pass")
    records["patched"].patch_install = {A: {"status": "not-applicable", "reason": (
        "cannot import name 'f' from 'torch.x' (/work/a/.nox/v/lib/python3.11/site-packages/torch/x.py)")}}
    status, why = patch_contributions(verdict_of(records), records)[A]
    assert status == PS_RETIRE and why == "the patch found its target gone: cannot import name 'f' from 'torch.x' (torch/x.py)"


def test_turning_an_error_into_a_hang_is_a_caveat():
    assert caveats(cell("error", "hang", "crash")) == (
        "patched turns vanilla's error into a hang", "deployed turns vanilla's error into a crash")
    assert caveats(cell("error", "pass", "pass")) == ()
    assert verdict_of(cell("error", "hang", "hang")).caveats


@pytest.mark.parametrize(("records", "notes"), [
    (cell("pass", "pass", "pass"), ()),
    (cell(("pass", "error"), "pass"), ("vanilla unexpectedly passes (expected error)",)),
    (cell(("error", "pass")), ("vanilla regression: error, expected pass",)),
    (cell(("hang", "error|mismatch")), ("vanilla hang, expected error|mismatch",)),
    (cell(None, "pass", "pass", deployed={"install": {"b": "error"}}),
     ("deployed: patch b install error: error reason",)),
])
def test_unexpected_notes(records, notes):
    assert unexpected_notes(records) == notes
    assert verdict_of(records).flagged == bool(notes)


def test_a_mismatch_without_the_documented_text_is_named():
    r = rec("mismatch", expected="error|mismatch", expected_match="grad", as_expected=False)
    assert unexpected_notes({"vanilla": r}) == ("vanilla mismatch does not contain 'grad'",)


@pytest.mark.parametrize(("statuses", "combined"), [
    ([], PS_NOT_RUN),
    ([PS_NOT_RUN, PS_NOT_APPLICABLE], PS_NOT_APPLICABLE),
    ([PS_RETIRE, PS_BACKPORT], PS_BACKPORT),
    ([PS_RETIRE, PS_API], PS_API),
    ([PS_API, PS_NEEDED], PS_NEEDED),
    ([PS_NEEDED, PS_NOT_PROVIDED], PS_NOT_PROVIDED),
    ([PS_NEEDED, PS_BROKEN, PS_RETIRE], PS_BROKEN),
])
def test_combine_patch_statuses(statuses, combined):
    assert combine_patch_statuses(statuses) == combined


def test_a_verdict_rule_names_only_outcome_classes():
    from harness.results.verdict import Rule

    with pytest.raises(ValueError, match="'xfial' is not an outcome class"):
        Rule(number=99, kind="*", vanilla="pass|xfial", patched="*", deployed="*", api="*", verdict="ok", meaning="typo")
    assert {outcome(None, variant="vanilla")} == {"missing"}
