"""The bug legend: every lettered scenario has its bug, every bug its scenarios and its
patch, and the README's copy is the generated table."""

from __future__ import annotations

import re

import pytest

from harness.bugs import BUGS, Bug, bug_for_scenario, legend_markdown
from harness.scenario.load import load_scenarios
from harness.scenario.scan import read_catalog
from tests.support import ROOT


def test_readme_legend_is_the_generated_table():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- bug-legend:start -->\n(.*?)<!-- bug-legend:end -->", text, re.S)
    assert m, "README.md has no bug-legend block"
    assert m.group(1) == legend_markdown(), "README's bug legend is stale: paste `python -m harness bugs` into it"


def test_every_lettered_scenario_has_a_bug_and_every_bug_a_scenario():
    names = read_catalog().names
    lettered = {n for n in names if re.match(r"^[a-z]\d*_", n)}
    assert lettered, "no lettered scenarios found"
    missing = sorted(n for n in lettered if bug_for_scenario(n) is None)
    assert not missing, f"scenarios whose letter is not in the legend: {missing}"
    for bug in BUGS:
        mine = [n for n in names if bug_for_scenario(n) is bug]
        assert mine, f"bug {bug.letter} has no scenario"
        assert set(bug.scenarios) <= names, f"bug {bug.letter} lists unknown scenarios"


def test_each_patch_is_used_by_its_bugs_scenarios():
    library = load_scenarios()
    assert not library.errors
    for bug in BUGS:
        if not bug.patch:
            continue
        used = {p for s in library.scenarios.values() if bug_for_scenario(s.name) is bug for p in s.patches}
        assert bug.patch in used, f"bug {bug.letter}: patch {bug.patch!r} is not among its scenarios' patches {used}"


def test_letters_are_unique_and_checked():
    letters = [b.letter for b in BUGS]
    assert len(letters) == len(set(letters))
    with pytest.raises(ValueError, match="one capital letter"):
        Bug(letter="ab", name="x", symptom="x", upstream="x", affected="x")
    with pytest.raises(ValueError, match="symptom is empty"):
        Bug(letter="Z", name="x", symptom=" ", upstream="x", affected="x")


def test_scenarios_without_a_letter_have_no_bug_unless_listed():
    assert bug_for_scenario("plain") is None
    assert bug_for_scenario("hf_llama_tied") is None
    assert bug_for_scenario("b2_mixed_dtype_late_param").letter == "B"
    assert bug_for_scenario("gloo_avg_reduce_scatter").letter == "M"
