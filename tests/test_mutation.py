"""The mutant list stays applicable as the patches evolve; one mutant is killed end to end."""

import sys

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "tests"))
import mutation  # noqa: E402


def test_every_mutant_changes_exactly_one_place_and_names_real_scenarios(tmp_path):
    from harness.scenario.load import load_scenarios

    names = set(load_scenarios().scenarios)
    assert len(mutation.MUTANTS) >= 12 and len({m.name for m in mutation.MUTANTS}) == len(mutation.MUTANTS)
    for i, m in enumerate(mutation.MUTANTS):
        copy = mutation.apply(m, tmp_path / str(i))
        assert (copy / m.file).read_text() != (mutation.PATCHES / m.file).read_text()
        assert set(m.scenarios) <= names, m.name


@pytest.mark.slow
def test_a_mutant_is_killed_by_the_scenario_made_for_it():
    assert mutation.main(["--only", "clip_no_clamp"]) == 0
