"""pytest hooks for the suite (it must leave no harness process behind) and its shared fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from tests.support import ROOT  # noqa: E402

#: test files that fork a zygote from the test process itself. ``Zygote.start`` must be called before
#: the process starts threads (a rank's worker forks its zygote first). A pytest worker's earlier
#: tests leave threads behind (stores' servers, thread pools). Twice in clean-clone CI runs on
#: 2026-12-07, a zygote forked late in a worker never sent its first reply (no cell process forked
#: in 30 s, the zygote alive). So these files run first, ahead of the rest of the collection.
FORK_FIRST = ("test_forked.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in FORK_FIRST)  # stable: the rest keep their order


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
            launch = ("harness.rank.worker", "harness.launch.forkserver", "torch.distributed.run")
            if (p.info["create_time"] or 0) >= started - 1 and any(w in cmd for w in launch) and any(m in cmd for m in markers):
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



_STARTED = pytest.StashKey[float]()


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo default group for the test; afterwards every fsdp_patches patch is undone."""
    import torch.distributed as dist

    import fsdp_patches

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    fsdp_patches.undo_all()
