"""Helpers the tests share (paths, record factories); ``conftest.py`` keeps pytest hooks and fixtures."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["FIXTURE_SCENARIOS", "GLOO_TIMEOUT_S", "ROOT", "make_record", "record_fields", "run_ranks"]


#: the process-group timeout of the tests' own ranks (gloo's default is 30 minutes)
GLOO_TIMEOUT_S = 60


def run_ranks(fn, args: tuple, nprocs: int = 2, timeout_s: float = 240) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, an error after ``timeout_s`` rather than a hang.

    Spawned, not forked: a fork of a pytest-xdist worker copies it while its I/O thread may hold
    a lock (the import lock, a stream's), and a child that needs that lock waits forever (seen once:
    both ranks idle, the test stuck until killed)."""
    import time

    import pytest
    import torch.multiprocessing as mp

    ranks = mp.start_processes(_leave_when_done, args=(fn, *args), nprocs=nprocs, start_method="spawn", join=False)
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"{fn.__name__}: its {nprocs} ranks still ran after {timeout_s} s (killed)")


def _leave_when_done(rank: int, fn, *args) -> None:
    """``fn(rank, *args)``, then the process ends at once: a rank that returned from gloo work can
    abort in torch's teardown at interpreter exit ("terminate called without an active exception",
    seen in ``tests/test_ledger.py``'s ranks), which would fail a test whose ranks all succeeded. An
    exception from ``fn`` still ends the rank as a failure, with its traceback."""
    import os

    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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

