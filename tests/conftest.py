import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def make_record(**fields):
    """A ``harness.record.Record`` with the required fields filled in (tests override any)."""
    from harness.record import Record

    base = {"run_id": "r", "started_at": "2026-11-20T10:00:00Z", "scenario": "s", "variant": "vanilla",
            "device": "cpu", "world_size": 2, "torch": "2.13.0", "status": "pass"}
    data = {**base, **fields}
    data.setdefault("expected", data["status"])
    data.setdefault("as_expected", data["status"] in str(data["expected"]).split("|"))
    return Record.from_json(data)


def pytest_sessionstart(session):
    import time

    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session, exitstatus):
    """The suite ends with a check that it left no harness process (worker or torchrun) behind."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once for all
        return

    import psutil

    markers = [str(session.config._tmp_path_factory.getbasetemp()), str(ROOT / "runs")]
    started = session.config.stash.get(_STARTED, 0.0)

    def ours():
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if (p.info["create_time"] or 0) >= started - 1 and ("harness.worker" in cmd or "torch.distributed.run" in cmd) \
                    and any(m in cmd for m in markers):
                found.append(p)
        return found

    left = ours()
    if left:
        _, left = psutil.wait_procs(left, timeout=5)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{p.pid} {' '.join(p.cmdline())[:160]}" for p in left if p.is_running()]
        if reporter is not None:
            reporter.write_line(f"the test suite left {len(lines)} harness process(es) running:", red=True)
            for line in lines:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = 1


import pytest  # noqa: E402

_STARTED = pytest.StashKey[float]()
