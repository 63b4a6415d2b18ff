"""Helpers the tests share (paths, a record factory); ``conftest.py`` keeps only pytest hooks."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["FIXTURE_SCENARIOS", "ROOT", "make_record"]


def make_record(**fields):
    """A ``harness.results.record.Record`` with the required fields filled in (tests override any)."""
    from harness.results.record import Record

    base = {"run_id": "r", "started_at": "2026-11-20T10:00:00Z", "scenario": "s", "variant": "vanilla",
            "device": "cpu", "world_size": 2, "torch": "2.13.0", "status": "pass"}
    data = {**base, **fields}
    data.setdefault("expected", data["status"])
    data.setdefault("as_expected", data["status"] in str(data["expected"]).split("|"))
    return Record.from_json(data)
