"""A cell's deadline inside a worker, and where each rank is (its phase).

Every step of user code in a cell runs under ``Watchdog.user_code(phase)``: importing
and installing the patches, building and sharding the model, forward and backward,
the reference. At the cell's deadline a watchdog thread

* interrupts Python code that is stuck (``SIGALRM`` to the main thread; its handler
  raises ``CellTimeout`` while user code runs), and
* shuts this process's collective sockets (``harness.rank.peers.shutdown_peer_sockets``), so a
  rank blocked in a gloo collective fails at once instead of at gloo's own timeout.

So a hung cell is recorded as a hang within its timeout plus a second or so, in the
same launch; sooner where the hang is certain, every rank of the slot blocked with nothing
running (``harness.rank.deadlock``: ``deadlock``). Code stuck where neither reaches (a C loop holding the GIL) is left to the
launcher, which kills the launch ``grace_s`` after the deadline.

A rank still in its cell ``STACKS_AFTER_S`` after the deadline writes every thread's Python
stack to ``stacks_file`` (``faulthandler``: a C thread, so a rank stuck in C code holding the
GIL writes it too); the launcher puts the stacks of the ranks it kills in the hang's record.

Each rank also stamps its phase into a small file the launcher can read after a kill,
so a hang record names the ranks that did not arrive and where they were. The file is
mapped into memory (``PhaseBoard``): a stamp is a write into a shared page, no file is
opened per stamp, and a reader sees the latest stamp even after the rank was killed; and when code
under test ends the rank with ``os._exit`` (``note_exits``), the rank notes the exit code
and that phase first, so the record can say which rank ended, how and where.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from harness.protocol import IDLE, write_exit, write_phase
from harness.rank.deadlock import LOOK_S, Slot
from harness.rank.phases import CLOCK, category_of

__all__ = ["STACKS_AFTER_S", "CellTimeout", "PhaseBoard", "Watchdog", "note_exits", "read_stacks", "stacks_file"]

#: seconds after a cell's deadline at which a rank still in it writes its threads' stacks
STACKS_AFTER_S = 1.0


class CellTimeout(BaseException):
    """The cell's deadline passed while user code ran (a BaseException: user code's
    ``except Exception`` must not swallow it)."""


class PhaseBoard:
    """A phase file (``harness.protocol.read_phase`` reads it) kept as a shared memory map:
    each ``write`` replaces its bytes in place (JSON padded with spaces), with no system
    call. The pages belong to the file, so what was written survives the process."""

    SIZE = 512

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.SIZE)
            self.map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)

    def write(self, phase: str) -> None:
        for keep in (400, 100, 30):  # shorter where its characters are escaped (\uXXXX)
            data = json.dumps({"phase": phase[:keep], "t": time.time()}).encode()
            if len(data) <= self.SIZE:
                break
        self.map[:] = data.ljust(self.SIZE)


def _board(path: Path | None) -> Callable[[str], None] | None:
    """How stamps reach ``path``: its memory map, or (where it cannot be mapped) a write of the file."""
    if path is None:
        return None
    try:
        return PhaseBoard(path).write
    except (OSError, ValueError):
        return lambda phase: write_phase(path, phase)


def stacks_file(stamp_file: Path) -> Path:
    """Where the rank that stamps ``stamp_file`` writes its threads' stacks (``STACKS_AFTER_S``)."""
    return stamp_file.with_suffix(".stacks")


def read_stacks(stamp_files: dict[int, Path]) -> str:
    """The stacks the ranks (rank -> stamp file) wrote for the cell they are in, one block per rank."""
    blocks = []
    for rank, path in sorted(stamp_files.items()):
        with contextlib.suppress(OSError):
            if text := stacks_file(path).read_text(errors="replace").strip():
                blocks.append(f"--- rank {rank}: its threads {STACKS_AFTER_S:g} s after the deadline ---\n{text}")
    return "\n\n".join(blocks)


class Watchdog:
    """One per worker process; arm it per cell."""

    def __init__(self, stamp_file: Path | None, on_expire: Callable[[], object]) -> None:
        self.stamp_file = stamp_file
        self._write_phase = _board(stamp_file)
        self.on_expire = on_expire
        self.phase = IDLE
        self.deadline: float | None = None
        self.fired = False
        #: at the deadline: the main thread's innermost frame, and whether it was waiting
        #: inside torch.distributed (a collective) rather than in the scenario's own code
        self.where = ""
        self.in_collective = False
        #: the cell's slot, looked at for a certain hang (``harness.rank.deadlock``); whether it found one
        self.slot: Slot | None = None
        self.deadlock = False
        self._in_user_code = False
        self._wake = threading.Condition()
        self._main = threading.main_thread().ident
        self._stacks = None  # the open stacks file (faulthandler keeps writing to it)
        signal.signal(signal.SIGALRM, self._on_alarm)
        threading.Thread(target=self._watch, name="cell-watchdog", daemon=True).start()

    # -- the cell -------------------------------------------------------------------
    def arm(self, timeout_s: float, slot: Slot | None = None) -> None:
        """Fire ``timeout_s`` from now, or as soon as ``slot`` shows the hang is certain."""
        with CLOCK.timed("watchdog"), self._wake:
            self.deadline, self.fired, self.deadlock, self.slot = time.time() + timeout_s, False, False, slot
            self._wake.notify()
            self._stacks_later(timeout_s + STACKS_AFTER_S)

    def disarm(self) -> None:
        with CLOCK.timed("watchdog"), self._wake:
            self.deadline = None
            self._wake.notify()
            faulthandler.cancel_dump_traceback_later()
        self.stamp(IDLE)

    def _stacks_later(self, after_s: float) -> None:
        """Every thread's stack into an emptied ``stacks_file`` ``after_s`` from now, unless disarmed."""
        if self.stamp_file is None:
            return
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if self._stacks is None or self._stacks.closed:
                self._stacks = open(stacks_file(self.stamp_file), "w")  # noqa: SIM115 (kept open for faulthandler)
            self._stacks.truncate(0)
            self._stacks.seek(0)
            faulthandler.dump_traceback_later(after_s, file=self._stacks)

    @contextlib.contextmanager
    def user_code(self, phase: str) -> Iterator[None]:
        """Run user code: interruptible at the deadline; raises ``CellTimeout`` at once
        if the deadline has already passed."""
        self.stamp(phase)
        if self.fired:
            raise CellTimeout(phase)
        self._in_user_code = True
        try:
            yield
        finally:
            self._in_user_code = False

    def stamp(self, phase: str) -> None:
        """Record where this rank is (also read by the launcher after a kill). The write (a memory
        map's bytes, about a microsecond) counts in the phase it opens: two clock switches around it
        would cost several times what they measure, and most stamps open the phase that runs
        (one micro-batch's forward after the last one's backward: "training")."""
        CLOCK.enter(category_of(phase))
        self.phase = phase
        if self._write_phase is not None:
            self._write_phase(phase)

    # -- the thread and the signal ----------------------------------------------------
    def _watch(self) -> None:
        with self._wake:
            while True:
                if self.deadline is None or self.fired:
                    self._wake.wait()
                    continue
                left = self.deadline - time.time()
                if left > 0 and not self._deadlocked():
                    self._wake.wait(timeout=min(left, LOOK_S) if self.slot else left)
                    continue
                self.fired, self.deadlock = True, left > 0
                self._note_where()
                if self._in_user_code:
                    signal.pthread_kill(self._main, signal.SIGALRM)
                self.on_expire()

    def _note_where(self) -> None:
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return
        code = frame.f_code
        self.where = f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"
        self.in_collective = any(f"{os.sep}torch{os.sep}distributed{os.sep}" in f.f_code.co_filename
                                 for f in _stack(frame, 3))

    def _deadlocked(self) -> bool:
        if self.slot is None:
            return False
        try:
            if not self._in_user_code:
                self.slot.away()
                return False
            return self.slot.certain(self._main, threading.get_native_id())
        except Exception:  # never the watchdog's end: the deadline still holds
            return False

    def _on_alarm(self, signum, frame) -> None:
        if self._in_user_code and self.fired:
            self._in_user_code = False
            raise CellTimeout(self.phase)


def note_exits(watchdog: Watchdog, exit_file: Path) -> Callable[[int], NoReturn]:
    """From now on ``os._exit`` in this process (a patch or scenario calling it) first notes
    the exit code and ``watchdog``'s phase in ``exit_file``. Returns the real ``os._exit``,
    for the harness's own exits. A process forked later exits without a note (its parent
    reports it)."""
    real = os._exit
    owner = os.getpid()

    def exit_noted(code: int) -> NoReturn:
        if os.getpid() == owner:
            with contextlib.suppress(Exception):
                write_exit(exit_file, int(code), watchdog.phase)
        real(code)

    os._exit = exit_noted
    return real


def _stack(frame, depth: int):
    while frame is not None and depth > 0:
        yield frame
        frame, depth = frame.f_back, depth - 1
