"""Processes a run starts and how they end (``harness.process.tree``): a whole tree killed,
a started process in a session of its own that dies with its parent, stop-signal handlers."""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from harness.process.tree import kill_tree, on_stop_signals, start, tree
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
