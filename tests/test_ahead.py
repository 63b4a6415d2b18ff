"""The next matrix session's run planned ahead (``harness.envs.ahead``) and ``harness run --hold``:
a held run writes nothing until it is let go, and a session adopts only the very command,
environment and venv it would run."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from nox.command import CommandFailed

from harness.envs import ahead
from harness.envs.matrix import load_matrix
from harness.envs.session import _next_command, run_version
from harness.launch.prestart import BACKGROUND_NICE, may_raise_priority
from harness.results.reading import load_records
from tests.support import ROOT, make_record
from tests.test_session import Recorder

HELD = "planned; held until a line comes on standard input (--hold)"


def _held_run(out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "run", "--hold", "--quiet", "--out", str(out), "--world-size", "1",
           "--scenario", "plain", "--variant", "vanilla", "--timeout", "60"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr.readline().strip() == HELD  # planned: the records it may reuse read, nothing written
    return proc


def test_a_held_run_writes_nothing_until_a_line_lets_it_go_and_plans_at_a_lower_priority(tmp_path):
    out = tmp_path / "runs" / "cpu" / "torch.jsonl"
    before = os.getpriority(os.PRIO_PROCESS, 0)
    proc = _held_run(out)
    time.sleep(1.0)
    assert proc.poll() is None and not out.parent.exists()
    server, = psutil.Process(proc.pid).children()
    lowered = {p.nice() for p in (psutil.Process(proc.pid), server)}
    proc.stdin.write("go\n")
    proc.stdin.close()
    restored = set()
    while proc.poll() is None and not restored:
        with contextlib.suppress(psutil.Error):
            restored = {p.nice() for p in (psutil.Process(proc.pid), server)} - lowered
        time.sleep(0.01)
    if may_raise_priority(before):
        assert lowered == {before + BACKGROUND_NICE} and restored == {before}
    else:  # it could not be put back: nothing is lowered
        assert lowered == {before}
    assert proc.wait(timeout=300) == 0, proc.stdout.read()[-2000:] + proc.stderr.read()[-2000:]
    records, _ = load_records([out])
    assert [(r.scenario, r.variant, r.status) for r, _ in records] == [("plain", "vanilla", "pass")]


def test_a_held_run_whose_input_ends_exits_without_writing_and_leaves_no_process(tmp_path):
    out = tmp_path / "runs" / "cpu" / "torch.jsonl"
    proc = _held_run(out)
    below = psutil.Process(proc.pid).children(recursive=True)  # its server, importing torch meanwhile
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert not out.parent.exists()
    _, alive = psutil.wait_procs(below, timeout=10)
    assert not alive


def test_what_runs_in_the_background_is_put_back_with_its_children(tmp_path):
    code = ("import os, subprocess, sys; from harness.launch.prestart import in_background; "
            "restore = in_background(); child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "low = (os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, child.pid)); restore([child.pid]); "
            "print(*low, os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, child.pid)); child.kill()")
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if not may_raise_priority(before):
        pytest.skip("this process may not raise a priority again (no CAP_SYS_NICE, RLIMIT_NICE too low)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == [str(before + BACKGROUND_NICE)] * 2 + [str(before)] * 2, res.stderr


# --------------------------------------------------------------------------- the nox side


SCRIPT = "import sys; print('args', sys.argv[1:]); print('went', sys.stdin.readline().strip()); sys.exit(int(sys.argv[1]))"


class _Venv(SimpleNamespace):
    """nox's venv as ``ahead`` reads it: its location, its ``env`` (the session's name among
    them), and ``_get_env`` as nox computes it."""

    def _get_env(self, env, include_outer_env=True):
        return {**(os.environ if include_outer_env else {}), "VIRTUAL_ENV": self.location, "CONDA_PREFIX": None,
                "UV_PYTHON": self.location, **self.env, **env, "PATH": f"{self.location}/bin:{os.environ['PATH']}"}


def _venv(root: Path, name: str) -> Path:
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text("home = x\n")
    return venv


def _sessions(tmp_path, monkeypatch, next_device="cpu", reused=True):
    """This session (torch 2.12.1) and the next one nox has queued (2.13.0), each in its venv."""
    monkeypatch.setattr("harness.envs.session.installed", lambda *a: True)
    mine, theirs = _venv(tmp_path, "mine"), _venv(tmp_path, "theirs")
    queued = SimpleNamespace(name="matrix", func=SimpleNamespace(call_spec={"torch": "2.13.0", "device": next_device}),
                             envdir=str(theirs), friendly_name="matrix(torch='2.13.0')",
                             reuse_existing_venv=lambda: reused)
    runner = SimpleNamespace(name="matrix", manifest=SimpleNamespace(_queue=[queued]))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "scenario.py").write_text("X = 1\n")
    this = SimpleNamespace(_runner=runner, virtualenv=_Venv(location=str(mine), env={"NOX_CURRENT_SESSION": "this"}))
    that = SimpleNamespace(_runner=SimpleNamespace(name="matrix", manifest=SimpleNamespace(_queue=[])),
                           virtualenv=_Venv(location=str(theirs), env={"NOX_CURRENT_SESSION": queued.friendly_name}),
                           bin_paths=[str(theirs / "bin")],
                           error=lambda m: that.errors.append(m), log=lambda m: that.logs.append(m), errors=[], logs=[])
    return this, that, theirs


def _command(code: int):
    return lambda torch, device, venv: (["-c", SCRIPT, str(code), "--torch", torch], {"FOO": str(venv)}, None)


def test_the_next_session_adopts_the_run_started_for_it_and_fails_on_its_code(tmp_path, monkeypatch, capfd):
    this, that, theirs = _sessions(tmp_path, monkeypatch)
    held = ahead.start_next(this, object(), after=("2.12.1", "cpu"), watched=[tmp_path / "code"], command=_command(3))
    assert held is not None and held.cmd[:5] == [str(theirs / "bin" / "python"), "-c", SCRIPT, "3", "--hold"]
    assert held.env["VIRTUAL_ENV"] == held.env["UV_PYTHON"] == str(theirs) and held.env["FOO"] == str(theirs)
    assert held.env["PATH"].startswith(f"{theirs}/bin:") and "CONDA_PREFIX" not in held.env
    assert ahead.held_for("2.13.0", "cpu") is held and ahead.held_for("2.13.0", "cpu") is None
    replaced = tmp_path / "torch-2.13.0.jsonl"
    replaced.write_text("old\n")
    went = []
    args, env, _ = _command(3)("2.13.0", "cpu", theirs)
    with pytest.raises(CommandFailed) as failed:  # as nox's session.run fails on a command's code
        ahead.adopt(that, held, args, env, [replaced], on_go=lambda: went.append(replaced.exists()))
    assert went == [False] and failed.value.return_code == 3 and held.proc.returncode == 3
    printed = capfd.readouterr().out
    assert "went go" in printed and "'--torch', '2.13.0'" in printed


@pytest.mark.parametrize("change", ["environment", "command", "venv", "install", "code", "ended"])
def test_a_held_run_that_is_not_exactly_what_the_session_runs_is_ended_not_adopted(tmp_path, monkeypatch, change):
    this, that, theirs = _sessions(tmp_path, monkeypatch)
    held = ahead.start_next(this, object(), after=("2.12.1", "cpu"), watched=[tmp_path / "code"], command=_command(0))
    ahead.held_for("2.13.0", "cpu")
    args, env, _ = _command(0)("2.13.0", "cpu", theirs)
    if change == "environment":
        monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")  # set in nox's environment since
    elif change == "command":
        args = [*args, "--fresh"]
    elif change == "venv":
        (theirs / "pyvenv.cfg").unlink()
        (theirs / "pyvenv.cfg").write_text("home = y\n")  # recreated
    elif change == "code":  # an edit (a pull) since it planned
        (tmp_path / "code" / "scenario.py").write_text("X = 22\n")
    elif change == "install":  # the session's own install step upgraded a package
        (theirs / "lib" / "python3.11" / "site-packages" / "pandas-3.0.1.dist-info").mkdir(parents=True)
    else:
        held.proc.stdin.close()
        held.proc.wait()
    replaced = tmp_path / "torch-2.13.0.jsonl"
    replaced.write_text("old\n")
    assert not ahead.adopt(that, held, args, env, [replaced])
    assert held.proc.poll() is not None and replaced.exists() and not that.errors


@pytest.mark.parametrize("why", ["cuda", "not reused", "install only"])
def test_nothing_is_started_for_a_next_session_that_is_not_a_reused_cpu_venv_or_under_install_only(tmp_path,
                                                                                                  monkeypatch, why):
    this, _, _ = _sessions(tmp_path, monkeypatch, next_device="cuda" if why == "cuda" else "cpu",
                           reused=why != "not reused")
    this._runner.global_config = SimpleNamespace(install_only=why == "install only")
    assert ahead.start_next(this, object(), after=("2.12.1", "cpu"), watched=[tmp_path / "code"], command=_command(0)) is None


def test_the_command_planned_ahead_is_the_one_the_session_runs(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    matrix = load_matrix(ROOT / "matrix.yaml")
    runs, venv = tmp_path / "runs", tmp_path / "venv"
    out = runs / "cpu" / "torch-2.13.0.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(make_record(inputs="k1", status="pass", as_expected=True).to_json() + "\n")
    args, env, previous = _next_command(matrix, "2.13.0", "cpu", venv, root=ROOT, runs=runs, rest=["--no-pin"])
    assert out.exists()  # kept until the run is adopted
    session = Recorder(venv, posargs=["--no-pin"])
    run_version(session, matrix, "2.13.0", "cpu", root=ROOT, runs=runs)
    (cmd, run_env), = session.runs
    assert cmd == ["python", *args] and run_env == env and args[args.index("--reuse-from") + 1] == str(previous)
