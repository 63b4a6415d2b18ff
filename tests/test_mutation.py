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
        for catch in m.caught_by:  # a cell of the mutant's own run, ending in a failing status
            scenario, _, rest = catch.cell.partition("[")
            variant, _, ws = rest.rstrip("]").partition(",w")
            assert scenario in m.scenarios and variant in ("patched", "deployed") and ws.isdigit(), (m.name, catch)
            assert catch.status in ("mismatch", "error", "hang", "crash"), (m.name, catch)
        assert m.caught_by, f"{m.name} names no cell that must catch it"


def test_a_mutant_counts_as_killed_only_by_a_cell_it_names():
    catch = mutation.Catch(cell="plain[patched,w2]", status="mismatch", match="grad")
    record = {"scenario": "plain", "variant": "patched", "world_size": 2, "status": "mismatch", "as_expected": False,
              "worst": "step 0 grad layers.0.weight", "exc_msg": None, "traceback": None}
    assert catch.caught(record)
    assert not catch.caught({**record, "world_size": 4})  # another cell
    assert not catch.caught({**record, "status": "error", "exc_msg": "patch install error: boom"})  # an install error
    assert not catch.caught({**record, "worst": "step 0 presence x"})  # another symptom
    assert not catch.caught({**record, "as_expected": True})


@pytest.mark.slow
def test_a_mutant_is_killed_by_the_scenario_made_for_it():
    assert mutation.main(["--only", "clip_no_clamp"]) == 0
