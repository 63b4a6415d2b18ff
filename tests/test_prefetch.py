"""harness.envs.prefetch: the next queued matrix session's installs fetched while this one runs."""

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from harness.envs import prefetch
from harness.envs.matrix import load_matrix
from harness.envs.session import prefetch_next
from tests.support import ROOT


def _session(queue, location="/x/.nox/matrix-torch-2-8-0-device-cpu"):
    runner = SimpleNamespace(name="matrix", manifest=SimpleNamespace(_queue=queue))
    return SimpleNamespace(_runner=runner, virtualenv=SimpleNamespace(location=location))


def _queued(name, **spec):
    return SimpleNamespace(name=name, func=SimpleNamespace(call_spec=spec))


def test_the_queue_gives_the_matrix_sessions_after_this_one_in_order():
    session = _session([_queued("matrix", torch="2.9.1", device="cpu"), _queued("tests"),
                        _queued("matrix", torch="2.10.0", device="cpu")])
    assert prefetch.queued_cells(session) == [("2.9.1", "cpu"), ("2.10.0", "cpu")]
    assert prefetch.queued_cells(SimpleNamespace()) == []  # not nox's session (or another nox): nothing
    assert prefetch.queued_cells(_session(None)) == []


def test_the_next_sessions_whole_install_line_is_fetched(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text("install: ['acme-kernels==1.4']\ndevices:\n  cpu:\n    torch: ['2.8.0', '2.9.1']\n")
    matrix = load_matrix(tmp_path / "m.yaml")
    started = []
    monkeypatch.setattr(prefetch, "start", lambda envdir, label, python, args: started.append(
        (envdir, label, python, args(tmp_path / "f"))) or "proc")
    session = _session([_queued("matrix", torch="2.9.1", device="cpu")], str(tmp_path / "venv"))
    assert prefetch_next(session, matrix, after=("2.8.0", "cpu")) == "proc"
    (envdir, label, python, line), = started
    assert (envdir, label, python) == (tmp_path, "2.9.1-cpu", str(tmp_path / "venv" / "bin" / "python"))
    assert line[0] == "torch==2.9.1" and "transformers==5.24.0" not in line  # m.yaml names no transformers
    assert line[-1] == "acme-kernels==1.4"
    assert prefetch_next(_session([]), matrix, after=("2.8.0", "cpu")) is None and len(started) == 1


def test_nothing_is_fetched_for_a_next_session_whose_venv_has_its_installs(tmp_path, monkeypatch):
    """A rerun of the matrix: the next venv's bytecode mark names exactly its installs."""
    from harness.envs.session import harness_folder, install_key, matrix_installs

    (tmp_path / "m.yaml").write_text("devices:\n  cpu:\n    torch: ['2.8.0', '2.9.1']\n")
    matrix = load_matrix(tmp_path / "m.yaml")
    monkeypatch.setattr(prefetch, "start", lambda *args: "proc")
    venv = tmp_path / ".nox" / "matrix-torch-2-9-1-device-cpu"
    queued = _queued("matrix", torch="2.9.1", device="cpu")
    queued.envdir = str(venv)
    session = _session([queued], str(tmp_path / ".nox" / "matrix-torch-2-8-0-device-cpu"))
    assert prefetch.queued_venv(session, ("2.9.1", "cpu")) == venv
    assert prefetch_next(session, matrix, after=("2.8.0", "cpu")) == "proc"  # no venv yet
    folder = harness_folder(venv)
    folder.mkdir(parents=True)
    (folder / "bytecode-written").write_text(install_key(matrix_installs(matrix, "2.9.1", "cpu", folder)))
    assert prefetch_next(session, matrix, after=("2.8.0", "cpu")) is None
    (folder / "bytecode-written").write_text(install_key(matrix_installs(matrix, "2.9.1", "cpu", folder)) + " x==1")
    assert prefetch_next(session, matrix, after=("2.8.0", "cpu")) == "proc"  # other installs: fetched


def test_a_relative_nox_envdir_still_finds_the_next_venvs_installs(tmp_path, monkeypatch):
    """nox's runners give ``.nox/<name>`` (its default ``--envdir`` is relative) while the venv's
    own session writes its mark from its absolute location: a rerun must not fetch. A fetch
    hard-links every file of the next version into a scratch folder and removes it, which moves
    the change time of every file those links share with the venvs (uv's cache links them), and
    so made each venv's installed-code digest read all its files again (3 s a CUDA build)."""
    from harness.envs.session import harness_folder, install_key, matrix_installs

    (tmp_path / "m.yaml").write_text("devices:\n  cpu:\n    torch: ['2.8.0', '2.9.1']\n")
    matrix = load_matrix(tmp_path / "m.yaml")
    monkeypatch.setattr(prefetch, "start", lambda *args: "proc")
    monkeypatch.chdir(tmp_path)
    queued = _queued("matrix", torch="2.9.1", device="cpu")
    queued.envdir = os.path.join(".nox", "matrix-torch-2-9-1-device-cpu")
    session = _session([queued], str(tmp_path / ".nox" / "matrix-torch-2-8-0-device-cpu"))
    folder = harness_folder(tmp_path / ".nox" / "matrix-torch-2-9-1-device-cpu")  # as its session writes it
    folder.mkdir(parents=True)
    key = install_key(matrix_installs(matrix, "2.9.1", "cpu", folder))
    assert str(folder) in key  # the overrides file is named by its absolute path
    (folder / "bytecode-written").write_text(key)
    assert prefetch.queued_venv(session, ("2.9.1", "cpu")) == tmp_path / ".nox" / "matrix-torch-2-9-1-device-cpu"
    assert prefetch_next(session, matrix, after=("2.8.0", "cpu")) is None


def _fake_uv(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\n{body}\n")
    uv.chmod(uv.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_the_fetch_goes_to_a_scratch_folder_that_is_gone_afterwards(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_uv(tmp_path, 'exit 0')}{os.pathsep}{os.environ['PATH']}")
    envdir = tmp_path / ".nox"
    (envdir / ".prefetch-2.7.1-cpu").mkdir(parents=True)  # left by a fetch that was killed
    folders = []
    proc = prefetch.start(envdir, "2.9.1-cpu", sys.executable, lambda f: folders.append(f) or ["torch==2.9.1"])
    assert proc.wait(timeout=60) == 0
    scratch = envdir / ".prefetch-2.9.1-cpu"
    assert folders == [scratch]
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["pip", "install"] and args[args.index("--target") + 1] == str(scratch / "site")
    assert args[-1] == "torch==2.9.1"
    assert sorted(p.name for p in envdir.iterdir()) == [".prefetch-2.9.1-cpu.log"]


def test_the_fetch_dies_with_the_process_that_started_it(tmp_path):
    # written then renamed: the shell makes the file before it writes the pid, and a reader that
    # saw the name first read '' (CI, once in ~1100 runs)
    bin_dir = _fake_uv(tmp_path, f"echo $$ > {tmp_path / 'pid.tmp'}\nmv {tmp_path / 'pid.tmp'} {tmp_path / 'pid'}\nexec sleep 600")
    code = (f"import os, sys, time; sys.path.insert(0, {str(ROOT)!r}); from harness.envs import prefetch\n"
            f"prefetch.start(__import__('pathlib').Path({str(tmp_path / 'nox')!r}), 'x', sys.executable, lambda f: [])\n"
            f"while not os.path.exists({str(tmp_path / 'pid')!r}): time.sleep(0.05)\nos._exit(0)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
    pid = int((tmp_path / "pid").read_text())
    deadline = time.time() + 20
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
