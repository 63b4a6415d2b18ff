"""Warm rank starts (``harness.launch.forkserver``): ranks forked from one warm server, and the
rank program that stands for each worker in torchrun's eyes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.launch.forkserver import _HEADER
from harness.rank.phases import read_totals

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, *extra: str) -> tuple[list[dict], Path]:
    out = tmp_path / "r.jsonl"
    subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "plain", "--world-size", "2", "--variant",
                    "vanilla", "--device", "cpu", "--quiet", "--out", str(out), *extra], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    return [json.loads(line) for line in out.read_text().splitlines()], tmp_path / "r.logs"


@pytest.mark.parametrize("cold", [False, True])
def test_ranks_start_forked_from_the_server_unless_cold(tmp_path, cold):
    records, logs = _run(tmp_path, *(["--cold-start"] if cold else []))
    assert [r["status"] for r in records] == ["pass"] and all(r["as_expected"] for r in records)
    server = list(logs.glob("*.forkserver.phases"))
    ranks = [read_totals(p) for p in sorted(logs.glob("*.rank[0-9].phases"))]
    assert len(ranks) == 2
    startup = [r["startup"][1] for r in ranks]  # CPU seconds before the worker's first line
    if cold:  # each rank imported torch itself (about a second of CPU)
        assert server == [] and min(startup) > 0.3, startup
    else:  # forked after the server's import: the import is counted once, the server's
        assert len(server) == 1 and max(startup) < 0.1, startup
        # and it does not warm up again: the server's imports and preload serve every rank
        assert all("preload" not in r for r in ranks), ranks
        totals = read_totals(server[0])
        assert totals["startup"][1] > 0.3 and totals["preload"][1] > 0 and totals["scenarios"][1] > 0
        # the server was started before the run planned, and handed this launch (harness.launch.prestart)
        assert "(the server started before planning)" in next(logs.glob("*.log")).read_text()


def _prestarted(tmp_path: Path):
    from harness.launch.prestart import started
    from harness.runconfig import RunConfig

    return started(RunConfig(scenarios=["plain"], out=tmp_path / "r.jsonl"))


def test_a_prestarted_server_no_launch_takes_ends_at_once_and_alone_at_the_end_of_its_input(tmp_path):
    with _prestarted(tmp_path) as server:
        time.sleep(0.2)
        assert server is not None and server.proc.poll() is None  # importing, or waiting for its launch
        pid, t0 = server.proc.pid, time.time()
    assert time.time() - t0 < 1.0 and not Path(f"/proc/{pid}").exists()  # a run that failed planning is not held
    with _prestarted(tmp_path) as server:  # a launcher gone without a word: the end of its input ends it
        server.proc.stdin.close()
        assert server.proc.wait(timeout=60) == 0


def test_a_prestarted_server_is_not_handed_a_launch_it_was_not_started_for(tmp_path):
    with _prestarted(tmp_path) as server:
        other = {**server.env, "PYTHONPATH": server.env["PYTHONPATH"] + os.pathsep + str(tmp_path)}
        assert server.hand(tmp_path / "plan.json", [server.python, "-c", "pass"], tmp_path / "log", other) is None
        assert server.hand(tmp_path / "plan.json", ["/another/python", "-c", "pass"], tmp_path / "log",
                           server.env) is None
        assert not server.used and server.proc.poll() is None


def test_cold_starts_prestart_no_server(tmp_path):
    from harness.launch.prestart import started
    from harness.runconfig import RunConfig

    with started(RunConfig(scenarios=["plain"], out=tmp_path / "r.jsonl", cold_start=True)) as server:
        assert server is None


def _listener(name: str) -> socket.socket:
    """Where a fake server waits for one rank program."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    return listener


def _rank_program(name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.launch.forkserver", "rank", "--socket", name, "--",
                             "--plan", "/nonexistent/plan.json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _serve_one(listener: socket.socket, cmd: list[str]) -> tuple[socket.socket, subprocess.Popen, dict]:
    """What the server does for one rank program, with ``cmd`` as the worker."""
    conn, _ = listener.accept()
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = _HEADER.unpack(data[:_HEADER.size])[0]
    data = data[_HEADER.size:]
    while len(data) < size:
        data += conn.recv(size - len(data))
    request = json.loads(data)
    worker = subprocess.Popen(cmd, stdin=fds[0], stdout=fds[1], stderr=fds[2])
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {worker.pid}\n".encode())
    return conn, worker, request


def _status_of(worker: subprocess.Popen) -> int:
    _, status = os.waitpid(worker.pid, 0)
    return status


def test_the_rank_program_hands_over_its_environment_and_exits_as_its_worker_did(tmp_path):
    name = f"fsdp-compat-test-{uuid.uuid4().hex}"
    listener = _listener(name)
    try:
        rank = _rank_program(name)
        conn, worker, request = _serve_one(listener, [sys.executable, "-c", "print('from the worker'); raise SystemExit(3)"])
        assert request["argv"] == ["--plan", "/nonexistent/plan.json"] and request["cwd"] == str(ROOT)
        assert request["env"]["PATH"] == os.environ["PATH"]
        conn.sendall(f"status {_status_of(worker)}\n".encode())
        output, _ = rank.communicate(timeout=30)
        assert rank.returncode == 3 and "from the worker" in output  # its streams were the worker's
    finally:
        listener.close()


def test_the_rank_program_passes_sigterm_on_and_dies_of_it_as_its_worker_did():
    name = f"fsdp-compat-test-{uuid.uuid4().hex}"
    listener = _listener(name)
    try:
        rank = _rank_program(name)
        conn, worker, _ = _serve_one(listener, [sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(0.5)  # the rank program has read the pid
        rank.send_signal(signal.SIGTERM)
        status = _status_of(worker)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM  # passed on
        conn.sendall(f"status {status}\n".encode())
        rank.communicate(timeout=30)
        assert rank.returncode == -signal.SIGTERM  # torchrun sees the worker's death
    finally:
        listener.close()


def test_without_a_server_the_rank_starts_its_worker_cold():
    rank = _rank_program(f"fsdp-compat-test-{uuid.uuid4().hex}")  # nobody listens there
    output, _ = rank.communicate(timeout=120)
    # the worker itself ran (and named the missing plan), not the rank program
    assert rank.returncode != 0 and "harness/rank/worker.py" in output and "/nonexistent/plan.json" in output


_FORKED_TORCHRUN = r'''
import json, socket, sys
import torch
from harness.launch.prestart import torchrun_forked

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python", sys.argv[1]]
child = torchrun_forked(run, listener, lambda: None)
other = torchrun_forked(["/other/python", *run[1:]], listener, lambda: None)
print(json.dumps({"code": child.wait(), "other": other}))
'''


@pytest.mark.parametrize("command, code", [("true", 0), ("false", 1)])
def test_a_prestarted_server_runs_torchruns_own_main_in_a_forked_child(command, code):
    """The agent starts without importing torch again, and ends as ``python -m torch.distributed.run``
    does: its code, and on a rank's failure torchrun's summary (what the launcher reads a crash from)."""
    res = subprocess.run([sys.executable, "-c", _FORKED_TORCHRUN, command], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert json.loads(res.stdout.splitlines()[-1]) == {"code": code, "other": None}, res.stderr[-2000:]
    if code:
        assert "ChildFailedError" in res.stderr and "Root Cause" in res.stderr and "exitcode  : 1" in res.stderr
