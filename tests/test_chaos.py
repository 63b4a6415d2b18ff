"""A short fault-injection soak (tests/chaos.py): every cell accounted for, no process left."""

import pytest

from tests import chaos

pytestmark = pytest.mark.slow


def test_a_short_soak_accounts_for_every_cell_and_leaves_no_process():
    res = chaos.soak(5, seed=3, timeout_s=4.0)
    assert res["problems"] == []
    totals = res["totals"]
    assert totals["planned"] > 0
    assert totals.get("recorded", 0) + totals.get("not run", 0) == totals["planned"]
    assert totals.get("left", 0) == 0
    assert sum(res["kinds"].values()) >= 5


def test_the_checks_report_lost_cells_and_slow_faults(tmp_path):
    """The soak's checks can fail: cells planned but not recorded, and a fault that cost too long."""
    r = chaos.Round(scenarios=["chaos_0"], world_sizes=[2], faults=[("hang all ranks", "chaos_0/w2/vanilla")])
    out = tmp_path / "records.jsonl"
    res = chaos._check(r, 1, "2 cells -> 1 launch\n", out, tmp_path, 4.0, None, 3.0, 0.0)
    assert "2 cells planned, 0 recorded + 0 not run" in res["problems"]
