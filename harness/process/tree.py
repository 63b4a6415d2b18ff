"""Processes a run starts, and how every one of them is ended.

torchrun puts its workers in sessions of their own, so killing torchrun's process group
does not reach them, and a worker blocked in a gloo collective may ignore SIGTERM. So:

* every process of a launch dies with its parent (``PR_SET_PDEATHSIG``: torchrun with
  the harness, each worker with torchrun's agent), whatever ends the parent, SIGKILL
  included;
* ``kill_tree`` walks the launch's whole tree (psutil) and SIGKILLs every process in it,
  then waits until each is gone;
* what the code under test starts may outlive its parent (a patch's ``Popen``, a daemon
  that forks and calls ``setsid``). torchrun and the launching process are *child
  subreapers* (``PR_SET_CHILD_SUBREAPER``): such an orphan is reparented to them, not to
  init, so it stays below the launch or becomes a child of the launcher. ``end_launch``
  ends the launch's tree, every process in one of its sessions (each worker has its own),
  and the launcher's children that appeared during the launch; then reaps them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

__all__ = ["become_subreaper", "children", "die_with_parent", "end_launch", "kill_tree", "on_stop_signals", "sessions",
           "start", "subreaper", "tree"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux).

    If the parent is already gone (this process was reparented before the call), exit now.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def become_subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper (Linux): orphans among its descendants are
    reparented to it instead of to init. False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """This process is a child subreaper inside the block (as it was before, after it).
    Yields whether it is one."""
    if not sys.platform.startswith("linux"):
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    before = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
    on = become_subreaper(True)
    try:
        yield on
    finally:
        if not before.value:
            become_subreaper(False)


def _launch_root() -> None:
    """In a started process before ``exec``: die with the parent, adopt orphans below it."""
    die_with_parent()
    become_subreaper()


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` answers SIGINT and SIGTERM inside the block; the previous handlers come
    back after it. Off the main thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


def start(cmd: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path, stdin: int | None = None
          ) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own, output to ``log``, dying with this process; the
    orphans of its descendants are reparented to it (a subreaper), so ``tree`` finds them.
    ``stdin``: as ``subprocess.Popen`` takes it (``PIPE``: a text pipe)."""
    out = open(log, "a")
    try:
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, stdin=stdin,
                                text=stdin is not None, start_new_session=True, preexec_fn=_launch_root)
    finally:
        out.close()


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it (those already gone are left out)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def children() -> set[int]:
    """The pids of this process's children now (``end_launch`` leaves these alone)."""
    return {p.pid for p in psutil.Process().children()}


def sessions(pid: int) -> set[int]:
    """The session ids of ``pid``'s tree (what ``end_launch`` sweeps later)."""
    found = set()
    for p in tree(pid):
        with contextlib.suppress(OSError):
            found.add(os.getsid(p.pid))
    return found


def kill_tree(pid: int, *, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL ``pid`` and all its descendants; wait until each is gone (a zombie counts as
    gone: it runs nothing, and its parent or init reaps it). The pids killed."""
    return _kill(tree(pid), timeout_s)


def end_launch(proc: subprocess.Popen, *, known_sessions: set[int], children_before: set[int],
               timeout_s: float = 10.0) -> list[int]:
    """End everything of the launch ``proc``: its tree, every process in one of its sessions
    (``known_sessions`` and those of its tree now), and this process's children other than
    ``children_before`` (orphans reparented here while this process is a subreaper). Reap
    those that are this process's children, ``proc`` included. The pids killed.

    Only what the launch started may be among them: while a launch runs, this process starts
    no other children."""
    mine = os.getpid()
    swept = (known_sessions | sessions(proc.pid)) - {os.getsid(0)}
    killed: list[int] = []
    for _ in range(10):  # a process may fork while its tree is killed: sweep until nothing is found
        found = {p.pid: p for p in [*tree(proc.pid), *_strays(swept, children_before, mine)] if _running(p)}
        found.pop(mine, None)
        if not found:
            break
        killed += _kill(list(found.values()), timeout_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)
    _reap_children(children_before | {proc.pid})
    return killed


def _strays(swept: set[int], children_before: set[int], mine: int) -> list[psutil.Process]:
    """Processes in the swept sessions, and this process's children but ``children_before``,
    with everything below them."""
    roots = []
    for p in psutil.process_iter(["ppid"]):
        try:
            if os.getsid(p.pid) in swept or (p.info["ppid"] == mine and p.pid not in children_before):
                roots.append(p)
        except (OSError, psutil.Error):
            continue
    below = []
    for p in roots:
        with contextlib.suppress(psutil.Error):
            below += p.children(recursive=True)
    return roots + below


def _reap_children(skip: set[int]) -> None:
    """Collect the exit status of this process's children but ``skip`` that have ended
    (killed orphans, reparented here): no zombie of the launch stays behind."""
    for p in psutil.Process().children():
        try:
            if p.pid in skip or p.status() != psutil.STATUS_ZOMBIE:
                continue
            os.waitpid(p.pid, os.WNOHANG)
        except (OSError, psutil.Error):
            continue


def _kill(procs: list[psutil.Process], timeout_s: float) -> list[int]:
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        if alive:
            time.sleep(0.01)
    assert not alive, f"processes survived SIGKILL: {[p.pid for p in alive]}"
    return [p.pid for p in procs]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
