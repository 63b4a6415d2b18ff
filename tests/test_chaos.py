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


def test_the_checks_see_a_hostile_text_made_active_and_a_patchs_child_left(tmp_path, monkeypatch):
    """The report check passes the real report and fails one that lets the text act; a child
    the patch started that is still running is a process left."""
    import subprocess

    from tests.support import make_record

    out = tmp_path / "records.jsonl"
    hostile = make_record(status="error", exc_type="=cmd|' /C calc'!A0", exc_msg="<script>alert(1)</script> | a||b",
                          expected="pass", scenario="chaos_0")
    out.write_text(hostile.to_json() + "\n")
    assert chaos._hostile_report_problems(out, tmp_path) == []

    def unsafe(paths, folder):
        folder.mkdir(parents=True, exist_ok=True)
        written = {k: folder / f"compat.{k}" for k in ("html", "md", "csv")}
        for path in written.values():
            path.write_text("x,=cmd|' /C calc'!A0: <script>alert(1)</script>\n")
        return written

    monkeypatch.setattr("harness.results.report.build_report", unsafe)
    problems = chaos._hostile_report_problems(out, tmp_path / "unsafe")
    assert "the html report has a <script" in problems and "the md report has a <script" in problems
    assert any(p.startswith("a CSV cell starts a formula") for p in problems)

    (tmp_path / "children").mkdir()
    child = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "children" / f"{child.pid}.pid").write_text(str(child.pid))
        assert [x.split()[0] for x in chaos.leftovers(tmp_path)] == [str(child.pid)]
    finally:
        child.kill()
        child.wait(timeout=10)
    assert chaos.leftovers(tmp_path) == []
