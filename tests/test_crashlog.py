"""What a launch's log and a rank's crash file say about how it died (``harness.process.crashlog``)."""

import subprocess
import sys

import pytest

from harness.process.crashlog import crash_cause, fatal_signal, last_what, tail

WHAT = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4\n"


def _summary(rank=1, exitcode=-6, traceback="Signal 6 (SIGABRT) received by PID 4242", other_rank=0):
    """torchrun's failure summary: another failure first, then the root cause (the first line ends
    in ": ", kept by the empty ``{""}``)."""
    return f"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {""}
============================================================
harness.rank.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-20_10:00:01
  host      : box
  rank      : {other_rank} (local_rank: {other_rank})
  exitcode  : 3 (pid: 4241)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-20_10:00:00
  host      : box
  rank      : {rank} (local_rank: {rank})
  exitcode  : {exitcode} (pid: 4242)
  error_file: <N/A>
  traceback : {traceback}
============================================================
"""


def _log(tmp_path, text):
    path = tmp_path / "L.log"
    path.write_text(text)
    return path


def test_a_signal_in_the_root_cause_names_the_rank_and_the_cpp_error(tmp_path):
    log = _log(tmp_path, "[rank0]: starting\n" + WHAT + _summary())
    assert crash_cause(log) == ("Signal", "rank 1 died: signal 6 (SIGABRT): [enforce fail at gloo/transport/tcp/"
                                "pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4", 1)


def test_a_signal_without_a_cpp_error(tmp_path):
    log = _log(tmp_path, _summary(rank=3, exitcode=-11, traceback="Signal 11 (SIGSEGV) received by PID 7"))
    assert crash_cause(log) == ("Signal", "rank 3 died: signal 11 (SIGSEGV)", 3)


def test_the_signal_that_ended_the_launch_carries_the_latest_cpp_error(tmp_path):
    earlier = "  what():  an earlier forked cell's abort\n"
    log = _log(tmp_path, earlier + "[rank0]: more cells ran\n" + WHAT + _summary())
    _, message, _ = crash_cause(log)
    crash = tmp_path / "L.rank1.crash"
    crash.write_text("Fatal Python error: Aborted\n")
    assert "8 vs 4" in message and "8 vs 4" in fatal_signal(crash, log, 1)[1]


def test_the_last_python_error_when_no_signal(tmp_path):
    text = ("[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: first\n"
            "[rank1]:[rank1]: RuntimeError: gloo failed: Connection closed by peer\n" + _summary(exitcode=1, traceback="<N/A>"))
    assert crash_cause(_log(tmp_path, text)) == ("RuntimeError", "RuntimeError: gloo failed: Connection closed by peer", 1)


def test_an_exit_code_when_nothing_else_is_known(tmp_path):
    log = _log(tmp_path, _summary(rank=2, exitcode=3, traceback="<N/A>"))
    assert crash_cause(log) == ("ExitCode", "rank 2 exited with code 3", 2)


def test_the_rank_comes_from_the_root_cause_not_other_failures(tmp_path):
    log = _log(tmp_path, _summary(rank=1, other_rank=0, exitcode=3, traceback="<N/A>"))
    assert crash_cause(log)[2] == 1


def test_no_log_or_an_empty_one(tmp_path):
    expected = ("LaunchError", "launch ended without a result (see log)", None)
    assert crash_cause(tmp_path / "absent.log") == expected
    assert crash_cause(_log(tmp_path, "")) == expected


def test_tail(tmp_path):
    log = _log(tmp_path, "a\nb\nc\n")
    assert tail(log, 2) == "b\nc" and tail(log, 10) == "a\nb\nc"
    assert tail(tmp_path / "absent.log", 3) == ""


def test_last_what(tmp_path):
    assert last_what(_log(tmp_path, "  what():  first\nnoise\n  what():  second one  \n")) == "second one"
    assert last_what(_log(tmp_path, "no c++ error here\n")) is None
    assert last_what(tmp_path / "absent.log") is None
    assert last_what(_log(tmp_path, "what(): " + "x" * 1000)) == "x" * 400


def _crash_report(tmp_path, statement):
    """A real faulthandler report of a Python process killed by a fatal signal."""
    crash = tmp_path / "L.rank2.crash"
    script = ("import ctypes, faulthandler, os, resource\n"
              "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
              f"faulthandler.enable(file=open({str(crash)!r}, 'w'))\n{statement}\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode < 0, proc
    return crash


@pytest.mark.parametrize("statement,expected", [
    ("os.abort()", "rank 2 died: signal 6 (SIGABRT)"),
    ("ctypes.string_at(0)", "rank 2 died: signal 11 (SIGSEGV)"),
])
def test_fatal_signal_reads_faulthandlers_report(tmp_path, statement, expected):
    crash = _crash_report(tmp_path, statement)
    assert fatal_signal(crash, tmp_path / "absent.log", 2) == ("Signal", expected)
    log = _log(tmp_path, WHAT)
    assert fatal_signal(crash, log, 2) == ("Signal", expected + ": [enforce fail at gloo/transport/tcp/pair.cc:446] "
                                           "op.preamble.length <= op.nbytes. 8 vs 4")


def test_no_fatal_signal_without_a_report(tmp_path):
    log = _log(tmp_path, WHAT)
    assert fatal_signal(tmp_path / "absent.crash", log, 0) is None
    empty = tmp_path / "L.rank0.crash"
    empty.write_text("")  # the rank lived: faulthandler wrote nothing
    assert fatal_signal(empty, log, 0) is None
    empty.write_text("Traceback (most recent call last):\nValueError: not a fatal signal\n")
    assert fatal_signal(empty, log, 0) is None
