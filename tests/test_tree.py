"""Processes a run starts and how they end (``harness.process.tree``): a whole tree killed,
a started process in a session of its own that dies with its parent, stop-signal handlers."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from harness.process.tree import children, end_launch, kill_tree, on_stop_signals, sessions, start, subreaper, tree
from tests.support import ROOT


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _eventually(condition, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while not condition() and time.time() < deadline:
        time.sleep(0.02)
    return condition()


def test_kill_tree_ends_every_process_below_the_root(tmp_path):
    # sh -> (sleep, sleep, sh -> sleep): grandchildren and a great-grandchild that ignore SIGTERM
    script = "trap '' TERM; echo started; sleep 60 & sleep 60 & (sleep 60 & wait) & wait"
    proc = start(["sh", "-c", script], env=dict(os.environ), cwd=tmp_path, log=tmp_path / "L.log")
    before: set[int] = set()
    try:
        assert _eventually(lambda: len(tree(proc.pid)) >= 5), [p.cmdline() for p in tree(proc.pid)]
        assert os.getsid(proc.pid) == proc.pid  # a session of its own
        before = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)} | {proc.pid}
        assert len([p for p in tree(proc.pid) if p.name() == "sleep"]) == 3
        killed = kill_tree(proc.pid)
        assert set(killed) == before and proc.pid in killed
        assert all(_gone(pid) for pid in before)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert _eventually(lambda: "started" in (tmp_path / "L.log").read_text())
    finally:  # whatever kill_tree did, nothing of this test stays behind
        try:
            before |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        for pid in before - {proc.pid}:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_gone_process_has_no_tree():
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    assert tree(proc.pid) == [] and kill_tree(proc.pid) == []


def test_a_started_process_dies_with_its_parent(tmp_path):
    """The parent exits (as a killed launcher would): its started child gets SIGKILL at once."""
    code = ("import os, sys\nfrom pathlib import Path\nfrom harness.process.tree import start\n"
            "p = start(['sleep', '60'], env=dict(os.environ), cwd=Path(sys.argv[1]), log=Path(sys.argv[1]) / 'c.log')\n"
            "print(p.pid, flush=True)\n")
    parent = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.returncode == 0, parent.stderr
    child = int(parent.stdout.split()[0])
    try:
        assert _eventually(lambda: _gone(child)), psutil.Process(child).cmdline()
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_stop_signals_reach_the_handler_inside_the_block_only():
    seen = []
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with on_stop_signals(lambda signum, frame: seen.append(signum)):
        os.kill(os.getpid(), signal.SIGTERM)
        assert _eventually(lambda: seen == [signal.SIGTERM], 5)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_stop_signals_off_the_main_thread_change_nothing():
    before = signal.getsignal(signal.SIGTERM)
    during = []

    def body():
        with on_stop_signals(lambda *_: None):
            during.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert during == [before]


_ORPHANS = """
import os, subprocess, sys, time
folder = sys.argv[1]
subprocess.Popen(["sleep", "60"])  # stays in the launch's session, orphaned when this process exits
if os.fork() == 0:  # a daemon: leaves the session, orphaned at once
    os.setsid()
    open(os.path.join(folder, "daemon"), "w").write(str(os.getpid()))
    time.sleep(60)
while not os.path.exists(os.path.join(folder, "daemon")):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("adopt", [True, False])
def test_end_launch_ends_the_orphans_of_a_launch_and_leaves_other_children_alone(tmp_path, adopt):
    """The launch's root exits, leaving a child in its session and a daemon in a session of its
    own. Adopted by this process (a subreaper), both are killed and reaped; not adopted, the
    child is still found by its session. A child this process had before is left alone."""
    mine = subprocess.Popen(["sleep", "60"])
    with subreaper() if adopt else contextlib.nullcontext(False) as adopting:
        before = children()
        proc = start([sys.executable, "-c", _ORPHANS, str(tmp_path)], env=dict(os.environ), cwd=tmp_path,
                     log=tmp_path / "L.log")
        seen = sessions(proc.pid)
        assert proc.wait(timeout=30) == 0, (tmp_path / "L.log").read_text()
        daemon = int((tmp_path / "daemon").read_text())
        in_session = [p.pid for p in psutil.process_iter() if p.pid != proc.pid and _sid(p.pid) == proc.pid]
        try:
            assert adopting == adopt and seen == {proc.pid} and len(in_session) == 1
            assert (daemon in {p.pid for p in psutil.Process().children()}) == adopt  # adopted, not init's
            killed = end_launch(proc, known_sessions=seen, children_before=before)
            assert set(killed) == ({daemon, *in_session} if adopt else set(in_session))
            assert all(_gone(pid) for pid in in_session)
            if adopt:
                assert not psutil.pid_exists(daemon)  # killed and reaped: not even a zombie
            assert mine.poll() is None  # not the launch's
        finally:
            for pid in [daemon, *in_session]:
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
            mine.kill()
            mine.wait(timeout=10)


def _sid(pid):
    try:
        return os.getsid(pid)
    except OSError:
        return None
