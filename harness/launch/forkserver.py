"""Warm rank starts (CPU launches): torchrun's ranks forked from one process that imported torch once.

Started cold, every rank of a launch imports Python's and torch's modules, the harness, the
modules a patch may touch and the scenarios' requirements (transformers) on its own: about
3.5 s of CPU a rank, four times over on a 4-rank launch. Instead the launcher starts this
module's *server* (``serve``), which starts torchrun at once and, meanwhile, imports all that
once for every cell of the launch (``harness.rank.worker.warm_up``), then listens on a Unix
socket; or the run started the server before it planned (``harness.launch.prestart``) and hands
it the launch when it has one. torchrun runs this module's *rank program* (``rank``: no torch,
a few milliseconds) in place of the worker. The rank program hands the server its environment
(``RANK``, ``MASTER_PORT``, ...), working folder, arguments and standard streams; the server
forks the worker from its warm copy (``harness.rank.worker.main``) with exactly those. The
rank program stays torchrun's process: it passes torchrun's SIGTERM, SIGINT and SIGHUP on to
the worker and exits as the worker did (its exit code, or the signal that killed it), so
torchrun, its error summary and the launcher see what a cold start shows. A worker dies with
the server (``PR_SET_PDEATHSIG``) and is killed when its rank program dies (torchrun's
SIGKILL); the server ends when torchrun does, with its exit status.

What differs from a cold start: every rank has the server's hash seed (``PYTHONHASHSEED``),
so the ranks iterate a set of strings in the same order, where cold ranks may not (a patch
whose collectives follow a set's order agrees with itself here; ``--cold-start`` starts every
rank on its own); and a rank has imported what any rank of the launch needs, not only its
own cells' needs. Where the server cannot be reached, the rank program runs the worker itself
(``exec``). CUDA launches and multi-node runs start cold. The server's own time per phase goes
beside the ranks' (``<launch>.forkserver.phases``): the import is counted once, as it is paid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from harness.process import collector

__all__ = ["command", "rank", "serve"]

#: the signals a rank program passes on to its worker
_PASSED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_HEADER = struct.Struct("!Q")


def command(plan, torchrun: list[str], worker_args: list[str], name: str | None = None) -> list[str]:
    """The launch's command: ``torchrun`` (its Python first) running the worker with ``worker_args``, through a
    server where ranks start warm; ``name``: a prestarted server's socket (the command is torchrun's, to hand it)."""
    from harness.launch.prestart import warm

    if not warm(plan.config, plan.device):
        return [*torchrun, "-m", "harness.rank.worker", *worker_args]
    sock = name or f"fsdp-compat-{plan.launch_id}-{os.getpid()}"
    ranks = [*torchrun, "-m", "harness.launch.forkserver", "rank", "--socket", sock, "--", *worker_args]
    serve = [torchrun[0], "-m", "harness.launch.forkserver", "serve", "--socket", sock, "--plan", worker_args[-1], "--"]
    return ranks if name else [*serve, *ranks]


# -- the rank program (torchrun's process; imports no torch) ---------------------------
def rank(name: str, worker_args: list[str]) -> None:
    """Have the server fork this rank's worker; wait for it; exit as it did."""
    _die_with_parent()
    conn = _connect(name)
    if conn is None:  # no server: this rank starts cold
        os.execv(sys.executable, [sys.executable, "-u", "-m", "harness.rank.worker", *worker_args])
    worker: list[int] = []
    pending: list[int] = []

    def pass_on(sig: int, _frame: object) -> None:
        if worker:
            os.kill(worker[0], sig)
        else:
            pending.append(sig)

    for sig in _PASSED:
        signal.signal(sig, pass_on)
    request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": worker_args}).encode()
    payload = _HEADER.pack(len(request)) + request
    try:
        sent = socket.send_fds(conn, [payload], [0, 1, 2])
        conn.sendall(payload[sent:])
    except OSError:
        pass  # the server is gone: no pid comes, this rank starts cold
    status = None
    for line in conn.makefile("r"):
        what, _, value = line.strip().partition(" ")
        if what == "pid":
            worker.append(int(value))
            for sig in pending:
                os.kill(worker[0], sig)
        elif what == "status":
            status = int(value)
            break
    if not worker:  # the server ended without forking a worker (its warm-up failed)
        if pending:
            os._exit(128 + pending[0])
        os.execv(sys.executable, [sys.executable, "-u", "-m", "harness.rank.worker", *worker_args])
    if status is None:
        print(f"forkserver: the server ended before rank {os.environ.get('RANK')}'s worker", file=sys.stderr)
        os._exit(1)
    _exit_as(status)


def _connect(name: str) -> socket.socket | None:
    """A connection to the server (listening since before torchrun started), or None."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect("\0" + name)
        return conn
    except OSError:
        conn.close()
        return None


def _exit_as(status: int) -> None:
    """Exit with the worker's wait ``status``: its code, or killed by its signal (no core file)."""
    if os.WIFSIGNALED(status):
        import resource
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _die_with_parent() -> None:
    import ctypes
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


# -- the server -------------------------------------------------------------------------
def serve(name: str, plan_path: str | None, torchrun: list[str], warmth: dict | None) -> None:
    """Start ``torchrun``, warm up for the launch's cells, fork a worker per rank program that
    asks; exit as torchrun did. ``warmth``: what a prestarted server imports before its plan (``await_launch``)."""
    import selectors
    import subprocess
    collector.pause()  # until the warm-up's end (harness.rank.worker.warm_up)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    run = None if plan_path is None else subprocess.Popen(torchrun, preexec_fn=_die_with_parent)
    from harness.launch.prestart import await_launch, torchrun_forked
    from harness.protocol import LaunchPlan
    from harness.rank import worker
    from harness.rank.phases import CLOCK, process_age

    CLOCK.reset("scenarios")
    CLOCK.add("startup", *process_age())
    loaded = None
    if run is None:  # started before the launcher planned (``harness.launch.prestart``): the launch comes now
        plan_path, run, loaded = await_launch(warmth or {"scenario_dirs": [], "select": [], "patches": None}, lambda cmd: (
            torchrun_forked(cmd, listener, _die_with_parent) or subprocess.Popen(cmd, preexec_fn=_die_with_parent)))
    try:
        plan = LaunchPlan.load(plan_path)
        worker.warm_up(plan, plan.cells, loaded=loaded)
        CLOCK.write(Path(plan.folder) / f"{plan.launch_id}.forkserver.phases", launch=plan.launch_id)
    except Exception:  # the ranks start cold, and meet what failed here under their cells' deadlines
        import traceback

        traceback.print_exc()
        print("forkserver: the warm-up failed; the ranks start cold", file=sys.stderr)
        listener.close()
        _exit_like(run.wait())
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, ("accept", None))
    sel.register(os.pidfd_open(run.pid), selectors.EVENT_READ, ("torchrun", None))
    workers: dict[int, socket.socket] = {}
    while True:
        for key, _ in sel.select():
            kind, pid = key.data
            if kind == "accept":
                conn, _ = listener.accept()
                pid = _fork_worker(conn, sel, listener, workers)
                if pid is not None:
                    workers[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, ("rank", pid))
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, ("worker", pid))
            elif kind == "rank":  # the rank program ended (torchrun killed it): so does its worker
                sel.unregister(key.fileobj)
                if not key.fileobj.recv(1):
                    _kill(pid)
            elif kind == "worker":
                sel.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                conn = workers.pop(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(f"status {status}\n".encode())
                conn.close()
            else:  # torchrun ended: so does the launch
                code = run.wait()
                for pid in workers:
                    _kill(pid)
                _exit_like(code)


def _exit_like(code: int) -> None:
    """Exit with ``Popen.returncode`` ``code`` (negative: killed by that signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


def _fork_worker(conn: socket.socket, sel, listener: socket.socket, workers: dict[int, socket.socket]) -> int | None:
    """Fork the worker a rank program asked for; tell it the pid. None: a request not understood."""
    conn.settimeout(30.0)
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        size = _HEADER.unpack(data[:_HEADER.size])[0]
        data = data[_HEADER.size:]
        while len(data) < size:
            more = conn.recv(size - len(data))
            if not more:
                raise OSError("the rank program closed its request early")
            data += more
        request = json.loads(data)
    except (OSError, ValueError, struct.error) as e:
        print(f"forkserver: a rank program's request was not understood: {e}", file=sys.stderr)
        conn.close()
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for key in list(sel.get_map().values()):
            if key.data[0] in ("torchrun", "worker"):  # pidfds: the worker needs none
                os.close(key.fd)
        sel.close()
        listener.close()
        for other in workers.values():
            other.close()
        conn.close()
        _become_worker(fds, request)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    return pid


def _become_worker(fds: list[int], request: dict) -> None:
    """In the forked child: take the rank program's streams, folder and environment; run the worker."""
    code = 1
    try:
        _die_with_parent()
        for sig in (*_PASSED, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from harness.rank import worker

        sys.argv = [worker.__file__, *request["argv"]]
        worker.main(request["argv"])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    """``serve --socket NAME --plan PLAN -- TORCHRUN...`` or ``rank --socket NAME -- WORKER-ARGS...``."""
    argv = sys.argv[1:] if argv is None else argv
    head, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="harness.launch.forkserver")
    parser.add_argument("role", choices=("serve", "rank"))
    parser.add_argument("--socket", required=True, help="the server's (abstract) Unix socket name")
    parser.add_argument("--plan", help="serve: the launch plan; none: it comes on standard input (prestart)")
    parser.add_argument("--prestart", type=json.loads, help="serve, prestarted: what to import before the plan (JSON)")
    args = parser.parse_args(head)
    if args.role == "rank":
        rank(args.socket, rest)
    else:
        serve(args.socket, args.plan, rest, args.prestart)


if __name__ == "__main__":
    main()
