"""Run a cell in a forked process per rank (CPU), and cells' references in a forked process.

A cell's process starts from the torch every cell starts from, whatever the cells before it did (isolation
by construction: no list of settings to put back can be complete), and an abort costs the cell, not the
launch: cells documented to crash or hang (gloo aborts the process on a collective size mismatch; a
desynchronized cell may hang) would otherwise end the whole launch and cost a relaunch (seconds of
imports on every rank). The cell's process trains, saves what FSDP2 produced and posts its outcome; the
worker judges. The judge's reference runs in a process of its own, the *referee* (``harness.rank.referee``:
kept from one reference to the next, fresh after any it had to put something back for), so it never runs
under the patch set it judges.

Both are forked from a *zygote*: a copy of the worker made at its start, after the imports and before any
cell ran. Forking the worker itself after a cell would not do: once FSDP2 has run a backward, CUDA builds
of torch (2.11 and later, measured; the CPU wheel is spared) refuse autograd in a forked child ("Unable to
handle autograd's threading in combination with fork-based multiprocessing"), and the worker's own
threads (watchdog, gloo, store) would be copied without their state. The zygote has neither.

The worker asks its zygote for a process over a socket; the zygote forks it, answers with its pid, waits
for it and answers with its wait status (a referee it does not wait for: the referee's pipes travel with
the request, and the worker asks the zygote to reap it once it has ended). The worker waits at most the
cell's deadline (plus grace), then kills it. When the cell's process died of a signal, the worker posts
that as the rank's outcome, so the slot's judge records a crash naming the rank. The launch goes on either
way. Zygote, cell and referee processes die with their parent (``harness.process.tree.die_with_parent``).
The zygote runs on every core the worker had before it was pinned, what it forks on the rank's core again
(``harness.process.cpus``). CUDA cannot be used across ``fork``: cuda cells run in the workers themselves
(their referees, forked from a zygote that never initialized CUDA, use the GPU).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from harness.plan.cells import Cell
from harness.process import collector
from harness.process.cpus import repin, unpin
from harness.process.crashlog import exit_message, last_what
from harness.process.tree import die_with_parent
from harness.protocol import SETUP_PHASES, CellKeys, LaunchPlan, read_phase
from harness.rank import peers
from harness.rank.leaks import CellState, TorchAttributes
from harness.rank.phases import CLOCK
from harness.rank.referee import Lines, Referee, serve_references
from harness.rank.watchdog import Watchdog
from harness.results.outcome import CellOutcome
from harness.vocabulary import Failure

__all__ = ["Zygote"]

#: how long past the cell's deadline a worker waits for its cell's process before killing it
_CHILD_GRACE_S = 10.0


@dataclass(kw_only=True)
class Zygote:
    """The worker's end of a zygote process (``Zygote.start``)."""

    pid: int
    #: requests to the zygote (a message each; a referee's pipes travel with its request)
    channel: socket.socket
    replies: Lines
    #: a referee serves one reference and ends (``--isolate fork``)
    one_reference_each: bool = False
    referee: Referee | None = None

    @classmethod
    def start(cls, plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes) -> Zygote | None:
        """Fork the zygote; call before any cell ran and before the worker starts threads.
        ``baseline``: torch's attributes as every cell's process starts with them."""
        if not hasattr(os, "fork"):
            return None
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            mine.close()
            os.close(rep_r)
            _serve(plan, scenarios, baseline, its, rep_w)
        its.close()
        os.close(rep_w)
        return cls(pid=pid, channel=mine, replies=Lines(rep_r), one_reference_each=plan.config.isolate == "fork")

    def close(self) -> None:
        """End the referee and the zygote (its loop ends with the channel)."""
        if self.referee is not None:
            self._end_referee(kill=True, reap=False)
        self.channel.close()
        os.close(self.replies.fd)

    def run_cell(self, run, cell: Cell, *, slot_rank0: int, rank: int, t0: float) -> bool:
        """``run``'s ``cell`` in a process forked from the zygote; the slot's first rank then
        judges it here. True: the launch goes on."""
        keys = CellKeys(launch_id=run.plan.launch_id, index=cell.index)
        pid = self.fork(dict(kind="cell", index=cell.index, slot_rank0=slot_rank0, rank=rank, t0=t0))
        if pid is None:  # the zygote is gone: run the cell here
            return run.run_here(cell, slot_rank0=slot_rank0, rank=rank, t0=t0)
        status = self.wait(pid, t0 + cell.timeout_s + _CHILD_GRACE_S)
        if status is None or os.WIFSIGNALED(status):
            sig = signal.SIGKILL if status is None else os.WTERMSIG(status)
            if not run.store.check([keys.status(rank)]):
                name = signal.Signals(sig).name
                what = last_what(run.plan.log_file)
                peers.post(run.store, keys, peers.RankOutcome(
                    rank=rank, ok=False, exc_type=Failure.SIGNAL, t_fail=time.time(), phase=_phase(run.plan, slot_rank0 + rank),
                    exc_msg=f"rank {rank} died: signal {int(sig)} ({name})" + (f": {what}" if what else "")))
        elif os.WIFEXITED(status) and not run.store.check([keys.status(rank)]):  # user code called os._exit
            phase = _phase(run.plan, slot_rank0 + rank)
            peers.post(run.store, keys, peers.RankOutcome(
                rank=rank, ok=False, exc_type=Failure.EXIT_CODE, t_fail=time.time(), phase=phase,
                exc_msg=exit_message(rank, os.WEXITSTATUS(status), phase)))
        _note_hung_install(run, cell, keys, rank)
        if rank == 0:
            run.judge(cell, t0=t0, slot_rank0=slot_rank0, forked=True)
        else:
            run.wait_recorded(cell, t0=t0)
        return True

    def reference(self, plan: LaunchPlan, cell: Cell, installs: dict[str, dict[str, str]],
                  deadline: float) -> CellOutcome:
        """The outcome of ``cell`` from the referee
        (``harness.rank.judging.check_against_reference`` on the snapshots its judging rank saved)."""
        verdict = plan.verdict_file(cell.index)
        verdict.unlink(missing_ok=True)
        referee = self.referee or self._start_referee()
        status, timed_out = None, False
        if referee is not None:
            try:
                os.write(referee.requests, (json.dumps(dict(index=cell.index, installs=installs)) + "\n").encode())
                reply = referee.replies.read(deadline)
            except OSError:  # it ended before the request
                reply = None
            if reply is not None and reply.startswith("done "):
                if reply.endswith(" spent"):  # it left something it put back, or serves one reference
                    self._end_referee(kill=False)
            else:
                timed_out = not referee.replies.ended
                status = self._end_referee(kill=timed_out)
        with contextlib.suppress(OSError, ValueError, TypeError):  # no answer, or not an outcome: named below
            return CellOutcome.from_json(json.loads(verdict.read_text()))
        if referee is None:
            why = "the zygote is gone"
        elif timed_out:
            return CellOutcome(status="hang", exc_type=Failure.CELL_TIMEOUT, exc_msg="reference/compare timed out")
        elif status is None:
            why = "its process wrote no answer"
        elif os.WIFSIGNALED(status):
            why = f"its process died: signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
        else:
            why = f"its process exited with code {os.WEXITSTATUS(status)}"
        return CellOutcome(status="error", exc_type=Failure.HARNESS_ERROR, exc_msg=f"reference/compare failed: {why}")

    def _start_referee(self) -> Referee | None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = self.fork(dict(kind="referee", one_each=self.one_reference_each), fds=(req_r, rep_w))
        os.close(req_r)
        os.close(rep_w)
        if pid is None:
            os.close(req_w)
            os.close(rep_r)
            return None
        self.referee = Referee(pid=pid, requests=req_w, replies=Lines(rep_r))
        return self.referee

    def _end_referee(self, *, kill: bool, reap: bool = True) -> int | None:
        """Close the referee's pipes (it ends), killed first where ``kill``; its wait status."""
        referee, self.referee = self.referee, None
        assert referee is not None
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(referee.pid, signal.SIGKILL)
        os.close(referee.requests)
        os.close(referee.replies.fd)
        if not reap:
            return None
        try:
            socket.send_fds(self.channel, [json.dumps(dict(kind="reap", pid=referee.pid)).encode()], [])
        except OSError:
            return None
        return _wait_status(self.replies.read(time.time() + 30))

    def fork(self, request: dict[str, Any], fds: tuple[int, ...] = ()) -> int | None:
        """The pid of a new process serving ``request`` (a cell's or a referee, whose pipes are
        ``fds``); None when the zygote is gone."""
        try:
            socket.send_fds(self.channel, [json.dumps(request).encode()], list(fds))
        except OSError:
            return None
        deadline = time.time() + 30
        while (reply := self.replies.read(deadline)) is not None:
            if reply.startswith("pid "):  # (a late status of a killed cell process is skipped)
                return int(reply.split()[1])
        return None

    def wait(self, pid: int, deadline: float) -> int | None:
        """The cell process's wait status; None when it overstayed (it is killed) or the zygote is gone."""
        reply = self.replies.read(deadline)
        if reply is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.replies.read(time.time() + 10)  # the zygote reaps it and reports (the status is not needed)
            return None
        return _wait_status(reply)


def _wait_status(reply: str | None) -> int | None:
    """The N of the zygote's ``status N`` reply; None for another reply (``status None``: already reaped)."""
    return int(reply[7:]) if reply is not None and reply.startswith("status ") and reply[7:].isdigit() else None


def _phase(plan: LaunchPlan, global_rank: int) -> str | None:
    return read_phase(plan.stamp_file(global_rank))


def _note_hung_install(run, cell: Cell, keys: CellKeys, rank: int) -> None:
    """A patch set whose install hung is not installed again in this launch (``CellRun.hung_sets``):
    every rank of the slot installs it, so every rank's worker sees its own rank hang there."""
    if not run.store.check([keys.status(rank)]):
        return
    outcome = peers.RankOutcome(**json.loads(run.store.get(keys.status(rank))))
    if outcome.exc_type == Failure.CELL_TIMEOUT and (outcome.phase or "").startswith(SETUP_PHASES[:2]):
        run.hung_sets.setdefault(cell.patches, cell.index)


# -- the zygote's side -------------------------------------------------------------------
def _serve(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, channel: socket.socket, replies: int) -> None:
    """The zygote: fork a process per request (a cell's: report its pid and wait status; a referee: its pid); reap."""
    code = 0
    try:
        die_with_parent()
        faulthandler.disable()  # the worker reports a cell process's death; the launch is not over
        start = CellState.take()  # once, not per cell; pinned as what it forks (2.14+: inter-op pool by cores)
        unpin()
        while True:
            message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 2)
            if not message:  # the worker is gone
                break
            request = json.loads(message)
            kind = request.pop("kind")
            if kind == "reap":
                try:
                    _, status = os.waitpid(request["pid"], 0)
                except ChildProcessError:
                    status = None
                os.write(replies, f"status {status}\n".encode())
                continue
            pid = os.fork()
            if pid == 0:
                repin()  # a cell's or referee's process runs on its rank's core, as the worker does
                os.close(replies)
                channel.close()
                if kind == "referee":
                    serve_references(plan, scenarios, baseline, *fds, one=request["one_each"], start=start)
                _cell_process(plan, scenarios, baseline, start=start, **request)
            for fd in fds:
                os.close(fd)
            os.write(replies, f"pid {pid}\n".encode())
            if kind == "cell":
                _, status = os.waitpid(pid, 0)
                os.write(replies, f"status {status}\n".encode())
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _cell_process(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, *, start: CellState, index: int,
                  slot_rank0: int, rank: int, t0: float) -> None:
    from harness.rank.cell import CellRun

    code = 4
    CLOCK.reset()
    try:
        die_with_parent()
        collector.freeze()
        world = int(os.environ["WORLD_SIZE"])
        run = CellRun(plan=plan, store=peers.connect_store(world, client_only=True), forked=True, baseline=baseline, start=start,
                      watchdog=Watchdog(plan.stamp_file(slot_rank0 + rank), on_expire=peers.unblock), scenarios=scenarios)
        code = 0 if run.run_here(plan.cell(index), slot_rank0=slot_rank0, rank=rank, t0=t0) else 3
    except BaseException:
        traceback.print_exc()
    finally:
        CLOCK.write(plan.phase_times_file(slot_rank0 + rank, cell=index), launch=plan.launch_id, rank=slot_rank0 + rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
