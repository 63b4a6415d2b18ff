"""Processes a run starts, and how every one of them is ended.

torchrun puts its workers in sessions of their own, so killing torchrun's process group
does not reach them, and a worker blocked in a gloo collective may ignore SIGTERM. So:

* every process of a launch dies with its parent (``PR_SET_PDEATHSIG``: torchrun with
  the harness, each worker with torchrun's agent), whatever ends the parent, SIGKILL
  included;
* ``kill_tree`` walks the launch's whole tree (psutil) and SIGKILLs every process in it,
  then waits until each is gone.
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

__all__ = ["die_with_parent", "kill_tree", "on_stop_signals", "start", "tree"]

_PR_SET_PDEATHSIG = 1


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


def start(cmd: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own, output to ``log``, dying with this process."""
    out = open(log, "a")
    try:
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=die_with_parent)
    finally:
        out.close()


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it (those already gone are left out)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int, *, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL ``pid`` and all its descendants; wait until each is gone (a zombie counts as
    gone: it runs nothing, and its parent or init reaps it). The pids killed."""
    procs = tree(pid)
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
