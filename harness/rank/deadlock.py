"""A hang that is certain before the cell's deadline: every rank of the slot blocked in
``torch.distributed`` while nothing of theirs runs.

A documented hang costs its whole timeout in every run (the incremental one too: a hang is
always run again). On CPU (gloo) a collective moves only while some rank's process runs:
each rank's watchdog looks every ``LOOK_S`` whether its rank is *quiet*: the main thread's
innermost Python frame is ``torch.distributed``'s, the same as at the last look, every other thread of the
process (the watchdog's own aside) is asleep, and together they spent no CPU time since. It
writes since when into its quiet file; a peer that has posted the cell says so in its done
file (``harness.rank.peers.post``). Once this rank has been quiet for ``QUIET_S`` and every
peer is done or has been quiet as long, the slot has had a common stretch of at least
``QUIET_S - LOOK_S`` in which no rank ran, so nothing was sent and nothing was in flight:
no rank can wake any more, and the watchdog ends the cell as a hang at once.

An I/O loop thread (gloo's TCP loop: asleep in ``epoll_wait`` at the look) polls every 10 ms, and
now and then the tick accounting charges it a tick: its own ticks do not count while none of
the process's TCP sockets has moved a byte since the last look (``TCP_INFO``'s bytes received
and acknowledged, nothing unread or unsent): without data in or out it only polled. Where the
sockets cannot be read, its ticks count as any thread's. A thread found runnable is looked at
again a few times within ``SETTLE_S`` before the look gives up (the main thread
found running ends the look at once: that is a cell's own work, and the look must not hold it up).

A quiet note is rewritten at every look (``<cell> <since> <last look>``) and counts only
while fresh; it is cleared when the rank leaves user code. Only CPU cells with peers: on a
GPU a host thread sleeps while the device works. A Python thread of the rank's own (a timer
that would abort and retry) makes it not quiet; gloo's threads have no Python frames. Not
covered: a group of the scenario's own whose timeout is shorter than the cell's (it would
have ended as an error at that timeout; the harness's groups use the cell's), and a peer
that posted the cell with asynchronous collectives never waited for. Ranks on another
machine leave no files here, so such a slot waits for its deadline as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import socket
import struct
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.plan.cells import Cell
from harness.protocol import LaunchPlan

__all__ = ["LOOK_S", "QUIET_S", "STALE_S", "Slot", "socket_fds"]

#: how often a rank looks
LOOK_S = 0.25
#: how long every rank must have been quiet
QUIET_S = 1.0
#: a peer's note older than this says nothing (its watchdog could not look: the GIL held, descheduled)
STALE_S = 3 * LOOK_S
#: how long a look waits for a runnable thread other than the main one to go back to sleep (an I/O
#: loop's poll takes microseconds)
SETTLE_S = 0.005
#: the epoll_wait family's syscall numbers (``/proc/<tid>/syscall``) per machine; elsewhere no thread is an I/O loop
_EPOLL_WAITS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}.get(platform.machine(), set())
_SIOCOUTQ = 0x5411


@dataclass(kw_only=True)
class Slot:
    """One rank's view of its slot in one cell."""

    cell: int
    #: this rank's quiet file
    own: Path
    #: every other rank's (done file, quiet file)
    peers: list[tuple[Path, Path]]
    _last: tuple | None = None
    _since: float | None = None
    _noted: str | None = None

    @classmethod
    def of(cls, plan: LaunchPlan, cell: Cell, slot_rank0: int, rank: int) -> Slot | None:
        """Rank ``rank``'s view of ``cell``'s slot; None for a cell not on CPU."""
        if cell.device != "cpu" or cell.world_size < 2:
            return None
        quiet = [plan.slot_file(slot_rank0 + r, "quiet") for r in range(cell.world_size)]
        return cls(cell=cell.index, own=quiet[rank], peers=[(plan.slot_file(slot_rank0 + r, "done"), quiet[r])
                                                            for r in range(cell.world_size) if r != rank])

    def certain(self, main_tid: int | None, watchdog_tid: int | None) -> bool:
        """Look once (the watchdog thread; ``main_tid``: the main thread's ``threading`` ident)."""
        now = time.time()
        look = _look(main_tid, watchdog_tid)
        if look is None or look != self._last:
            self._last, self._since = look, (now if look is not None else None)
            self._note("")
            return False
        assert self._since is not None
        self._note(f"{self.cell} {self._since!r} {now!r}")
        if now - self._since < QUIET_S:
            return False
        return all(_read(done) == str(self.cell) or _quiet_for(quiet, self.cell, now) >= QUIET_S
                   for done, quiet in self.peers)

    def away(self) -> None:
        """The rank is outside user code: whatever it noted no longer holds."""
        self._last = self._since = None
        self._note("")

    def _note(self, text: str) -> None:
        if text != self._noted:
            self._noted = text
            try:
                self.own.write_text(text)
            except OSError:
                pass


def _look(main_tid: int | None, watchdog_tid: int | None) -> tuple | None:
    """(main frame, its line, each other thread's CPU ticks, the I/O loop threads, the process's
    TCP traffic) when quiet; None when not."""
    innermost, others = _innermost(main_tid)
    # the innermost Python frame itself: a patch sleeping inside a torch.distributed call is not quiet
    if innermost is None or f"{os.sep}torch{os.sep}distributed{os.sep}" not in innermost[2]:
        return None
    if others:
        return None  # a Python thread of the rank's own may still act (a timer, a retry)
    main = next((str(t.native_id) for t in threading.enumerate() if t.ident == main_tid), None)
    threads, loops = [], []
    try:
        # the main thread first and once: running (a cell's own work), it ends the look at once
        for task in sorted(Path("/proc/self/task").iterdir(), key=lambda t: (t.name != main, t.name)):
            if task.name == str(watchdog_tid):
                continue
            ticks = _asleep(task, settle=SETTLE_S if task.name != main else 0.0)
            if ticks is None:
                return None
            if task.name != main and _in_epoll_wait(task):
                loops.append((task.name, ticks))
            else:
                threads.append((task.name, ticks))
    except (OSError, IndexError, ValueError):
        return None  # a thread ended between listing and reading it, or no /proc: not quiet
    traffic = _tcp_traffic() if loops else ()
    if traffic is _MOVING:
        return None
    if traffic is None:  # no way to tell its polls from its work: its ticks count
        threads, loops = sorted(threads + loops), []
    return innermost[0], innermost[1], tuple(threads), tuple(tid for tid, _ in loops), traffic


def _asleep(task: Path, settle: float) -> int | None:
    """The thread's CPU ticks where it is asleep (looked at again for up to ``settle`` seconds
    while it is runnable); None where it is not."""
    deadline = time.monotonic() + settle
    while True:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "S":
            return int(fields[11]) + int(fields[12])
        if fields[0] != "R" or time.monotonic() >= deadline:
            return None
        time.sleep(0.001)


def _in_epoll_wait(task: Path) -> bool:
    """Whether the thread sleeps in the epoll_wait family (an I/O loop waiting for its sockets)."""
    with contextlib.suppress(OSError, IndexError):
        return (task / "syscall").read_text().split()[0] in _EPOLL_WAITS
    return False


def socket_fds() -> list[int]:
    """This process's file descriptors that are sockets, in order (Linux: ``/proc/self/fd``; ``OSError``
    where it cannot be listed). One closed meanwhile is left out (the listing's own among them)."""
    found = []
    for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.append(fd)
    return found


#: ``_tcp_traffic``: bytes wait unread or unsent on a socket
_MOVING: tuple = ("moving",)


def _tcp_traffic() -> tuple | None:
    """Per TCP socket of this process: bytes received and acknowledged so far (``TCP_INFO``);
    ``_MOVING`` where bytes wait unread or unsent; None where that cannot be read."""
    found = []
    try:
        fds = socket_fds()
    except OSError:
        return None
    for fd in fds:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    found.append((fd, "listening"))  # moves no data; a connection it accepts is a new socket
                    continue
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                if len(info) < 136:
                    return None
                acked, received = struct.unpack_from("QQ", info, 120)
                unread = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
                unsent = struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            return None
        if unread or unsent:
            return _MOVING  # bytes on their way: not quiet
        found.append((fd, acked, received))
    return tuple(found) or None


def _innermost(main_tid: int | None) -> tuple[tuple[int, int, str] | None, bool]:
    """(id, line, file) of thread ``main_tid``'s innermost Python frame, and whether a Python
    thread other than it and this one runs. No frame outlives the call: the dict holds this
    very frame, whose locals hold the dict; kept past the return, that cycle drags the main
    thread's frames, and the tensors in their locals, into the collector's garbage, where
    torch 2.7-2.9 clear a DTensor that is still a param's grad (its ``_spec`` gone)."""
    frames = sys._current_frames()
    frame = frames.get(main_tid)
    others = any(t not in (main_tid, threading.get_ident()) for t in frames)
    innermost = None if frame is None else (id(frame), frame.f_lineno, frame.f_code.co_filename)
    del frames, frame
    return innermost, others


def _quiet_for(path: Path, cell: int, now: float) -> float:
    """How long the rank of quiet file ``path`` has been quiet in ``cell``; 0 where its note is
    of another cell, or stale (its watchdog has not looked for ``STALE_S``)."""
    words = _read(path).split()
    try:
        if len(words) != 3 or words[0] != str(cell) or now - float(words[2]) > STALE_S:
            return 0.0
        return now - float(words[1])
    except ValueError:
        return 0.0


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return ""
