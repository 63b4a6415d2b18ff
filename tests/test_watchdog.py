"""A cell's deadline inside a worker (``harness.rank.watchdog``): interrupting stuck user code,
noting where it was, and the phase file the launcher reads after a kill."""

import os
import signal
import time

import pytest

from harness.protocol import IDLE, read_phase
from harness.rank.watchdog import CellTimeout, Watchdog


@pytest.fixture
def make_watchdog(tmp_path):
    """Watchdogs whose expiries are counted; disarmed and SIGALRM restored after the test."""
    previous = signal.getsignal(signal.SIGALRM)
    made = []

    def make(stamp_file=tmp_path / "L.rank0.phase"):
        expired: list[float] = []
        wd = Watchdog(stamp_file, on_expire=lambda: expired.append(time.time()))
        made.append(wd)
        return wd, expired

    yield make
    for wd in made:
        wd.disarm()
    signal.signal(signal.SIGALRM, previous)


def _eventually(condition, timeout_s=5.0):
    deadline = time.time() + timeout_s
    while not condition() and time.time() < deadline:
        time.sleep(0.01)
    return condition()


def test_stamps_go_to_the_phase_file(make_watchdog, tmp_path):
    wd, _ = make_watchdog()
    wd.arm(30)
    with wd.user_code("build model"):
        assert read_phase(tmp_path / "L.rank0.phase") == "build model"
    wd.stamp("step 0 micro-batch 0 forward")
    assert (wd.phase, read_phase(tmp_path / "L.rank0.phase")) == ("step 0 micro-batch 0 forward",) * 2
    wd.disarm()
    assert (wd.phase, read_phase(tmp_path / "L.rank0.phase")) == (IDLE, IDLE)


def test_a_stamp_opens_no_file(make_watchdog, tmp_path, monkeypatch):
    """Stamps are writes into the phase file's memory map: thousands per launch cost no file opens."""
    import builtins
    import pathlib

    wd, _ = make_watchdog()

    def refuse(*args, **kwargs):
        raise AssertionError("a stamp opened a file")

    with monkeypatch.context() as m:
        m.setattr(os, "open", refuse)
        m.setattr(builtins, "open", refuse)
        m.setattr(pathlib.Path, "open", refuse)
        for k in range(100):
            wd.stamp(f"step {k} micro-batch 0 forward")
    assert read_phase(tmp_path / "L.rank0.phase") == "step 99 micro-batch 0 forward"


def test_a_long_phase_of_escaped_characters_still_reads_back(make_watchdog, tmp_path):
    wd, _ = make_watchdog()
    wd.stamp("install patches: " + "\u00e9" * 1000)
    assert read_phase(tmp_path / "L.rank0.phase").startswith("install patches: \u00e9")
    wd.stamp("init group")  # a shorter stamp leaves nothing of the longer one behind
    assert read_phase(tmp_path / "L.rank0.phase") == "init group"


def test_the_last_stamp_survives_the_process_killed(tmp_path):
    import subprocess
    import sys

    from tests.support import ROOT

    code = ("import os, signal, sys; from pathlib import Path; from harness.rank.watchdog import Watchdog\n"
            "wd = Watchdog(Path(sys.argv[1]), on_expire=lambda: None)\n"
            "wd.stamp('step 2 micro-batch 1 backward'); os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "L.rank3.phase")], cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert read_phase(tmp_path / "L.rank3.phase") == "step 2 micro-batch 1 backward"


def test_no_phase_file_is_fine(make_watchdog):
    wd, _ = make_watchdog(stamp_file=None)
    wd.stamp("init group")
    assert wd.phase == "init group"


def test_the_deadline_interrupts_stuck_user_code(make_watchdog):
    wd, expired = make_watchdog()
    t = time.time()
    wd.arm(0.2)
    with pytest.raises(CellTimeout, match="step 0 micro-batch 0 forward"):
        with wd.user_code("step 0 micro-batch 0 forward"):
            time.sleep(30)
    assert time.time() - t < 5
    assert wd.fired and _eventually(lambda: len(expired) == 1)
    assert wd.where.startswith("test_the_deadline_interrupts_stuck_user_code (test_watchdog.py:")
    assert wd.in_collective is False


def test_user_code_cannot_swallow_the_timeout(make_watchdog):
    wd, _ = make_watchdog()
    swallowed = False
    wd.arm(0.2)
    with pytest.raises(CellTimeout):
        with wd.user_code("install patches"):
            try:
                time.sleep(30)
            except Exception:  # what careless user code does
                swallowed = True
    assert not swallowed


def test_waiting_in_torch_distributed_counts_as_in_a_collective(make_watchdog):
    source = "import time\n\ndef wait_for_peers():\n    time.sleep(30)\n"
    fake = os.path.join(os.sep, "site-packages", "torch", "distributed", "fake_c10d.py")
    namespace: dict = {}
    exec(compile(source, fake, "exec"), namespace)
    wd, _ = make_watchdog()
    wd.arm(0.2)
    with pytest.raises(CellTimeout):
        with wd.user_code("step 1 clip"):
            namespace["wait_for_peers"]()
    assert wd.in_collective is True and wd.where == "wait_for_peers (fake_c10d.py:4)"


def test_a_deadline_outside_user_code_raises_at_the_next_user_code(make_watchdog):
    wd, expired = make_watchdog()
    wd.arm(0.1)
    assert _eventually(lambda: wd.fired)  # the harness's own code is not interrupted
    assert _eventually(lambda: len(expired) == 1)
    ran = False
    with pytest.raises(CellTimeout, match="step 2 clip"):
        with wd.user_code("step 2 clip"):
            ran = True
    assert not ran and wd.phase == "step 2 clip"


def test_disarm_before_the_deadline_cancels_it(make_watchdog):
    wd, expired = make_watchdog()
    wd.arm(0.2)
    with wd.user_code("reference"):
        pass
    wd.disarm()
    time.sleep(0.5)
    assert not wd.fired and expired == []
    with wd.user_code("reference"):
        time.sleep(0.01)


def test_a_new_arm_clears_the_last_cells_expiry(make_watchdog):
    wd, expired = make_watchdog()
    wd.arm(0.05)
    assert _eventually(lambda: len(expired) == 1)
    wd.arm(30)
    assert not wd.fired
    with wd.user_code("init group"):
        time.sleep(0.01)
    assert len(expired) == 1


def test_a_stray_alarm_outside_a_deadline_is_ignored(make_watchdog):
    wd, _ = make_watchdog()
    wd.arm(30)
    with wd.user_code("build model"):
        signal.raise_signal(signal.SIGALRM)  # not fired: user code goes on
        time.sleep(0.01)
    assert not wd.fired


_EXITS = """
import os, sys
from pathlib import Path
from harness.rank.watchdog import Watchdog, note_exits
folder = Path(sys.argv[1])
wd = Watchdog(folder / "L.rank0.phase", on_expire=lambda: None)
real = note_exits(wd, folder / "L.rank0.exit")
wd.stamp("install patches: p1")
if sys.argv[2] == "harness":
    real(3)
if os.fork() == 0:
    os._exit(9)  # a forked child: its parent reports it, no note
os.wait()
os._exit(5)
"""


@pytest.mark.parametrize("who", ["user", "harness"])
def test_an_exit_by_code_under_test_leaves_a_note_the_harness_own_does_not(tmp_path, who):
    import subprocess
    import sys

    from harness.protocol import RankExit, read_exit
    from tests.support import ROOT

    done = subprocess.run([sys.executable, "-c", _EXITS, str(tmp_path), who], cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == (5 if who == "user" else 3), done.stderr
    noted = read_exit(tmp_path / "L.rank0.exit")
    assert noted == (RankExit(code=5, phase="install patches: p1") if who == "user" else None)
