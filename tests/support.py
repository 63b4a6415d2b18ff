"""Helpers the tests share (paths, record factories); ``conftest.py`` keeps pytest hooks and fixtures."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["FIXTURE_SCENARIOS", "ROOT", "make_record", "record_fields"]


def record_fields(**fields) -> dict:
    """A record's JSON fields with the required ones filled in (tests override any)."""
    base = {"run_id": "r", "started_at": "2026-11-20T10:00:00Z", "scenario": "s", "variant": "vanilla",
            "device": "cpu", "world_size": 2, "torch": "2.13.0", "status": "pass"}
    data = {**base, **fields}
    data.setdefault("expected", data["status"])
    data.setdefault("as_expected", data["status"] in str(data["expected"]).split("|"))
    return data


def make_record(**fields):
    """A ``harness.results.record.Record`` made from ``record_fields``."""
    from harness.results.record import Record

    return Record.from_json(record_fields(**fields))

