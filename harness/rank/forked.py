"""Run a cell in a forked process per rank (CPU), and a cell's reference in a forked process.

A cell's process starts from the torch every cell starts from, whatever the cells before
it did (isolation by construction: no list of settings to put back can be complete), and
an abort costs the cell, not the launch: cells documented to crash or hang (gloo aborts the
process on a collective size mismatch; a desynchronized cell may hang) would otherwise end
the whole launch and cost a relaunch (seconds of imports on every rank). The cell's process
trains, saves what FSDP2 produced and posts its outcome; the worker judges. The judge's
reference runs in a process of its own too (``reference``), so it never runs under the
patch set it judges.

Both are forked from a *zygote*: a copy of the worker made at its start, after
the imports and before any cell ran. Forking the worker itself after a cell would not do:
once FSDP2 has run a backward, CUDA builds of torch (2.11 and later, measured; the CPU wheel
is spared) refuse autograd in a forked child ("Unable to handle autograd's threading in
combination with fork-based multiprocessing"), and the worker's own threads (watchdog, gloo,
store) would be copied without their state. The zygote has neither.

The worker asks its zygote for a process over a pipe; the zygote forks it, answers with
its pid, waits for it and answers with its wait status. The worker waits at most the
cell's deadline (plus grace), then kills it. When the cell's process died of a signal, the
worker posts that as the rank's outcome, so the slot's judge records a crash naming the
rank. The launch goes on either way. Zygote, cell and reference processes die with their
parent (``harness.process.tree.die_with_parent``). CUDA cannot be used across ``fork``: cuda
cells run in the workers themselves (their references, CPU-only, are still forked).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from harness.plan.cells import Cell
from harness.process.crashlog import exit_message, last_what
from harness.process.tree import die_with_parent
from harness.protocol import SETUP_PHASES, CellKeys, LaunchPlan, read_phase
from harness.rank import peers
from harness.rank.leaks import TorchAttributes
from harness.rank.phases import CLOCK
from harness.rank.watchdog import Watchdog
from harness.vocabulary import Failure

__all__ = ["Zygote"]

#: how long past the cell's deadline a worker waits for its cell's process before killing it
_CHILD_GRACE_S = 10.0


@dataclass(kw_only=True)
class Zygote:
    """The worker's end of a zygote process (``Zygote.start``)."""

    pid: int
    requests: int  # fd the worker writes requests to
    replies: int  # fd the worker reads replies from
    _buffer: bytes = b""

    @classmethod
    def start(cls, plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes) -> Zygote | None:
        """Fork the zygote; call before any cell ran and before the worker starts threads.
        ``baseline``: torch's attributes as every cell's process starts with them."""
        if not hasattr(os, "fork"):
            return None
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(req_w)
            os.close(rep_r)
            _serve(plan, scenarios, baseline, req_r, rep_w)
        os.close(req_r)
        os.close(rep_w)
        return cls(pid=pid, requests=req_w, replies=rep_r)

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
                  deadline: float) -> dict[str, Any]:
        """The outcome fields of ``cell`` from a reference process
        (``harness.rank.judging.check_against_reference`` on the snapshots its judging rank saved)."""
        verdict = plan.verdict_file(cell.index)
        verdict.unlink(missing_ok=True)
        pid = self.fork(dict(kind="reference", index=cell.index, installs=installs))
        status = None if pid is None else self.wait(pid, deadline)
        try:
            return json.loads(verdict.read_text())
        except (OSError, ValueError):
            pass
        if pid is None:
            why = "the zygote is gone"
        elif status is None:
            return dict(status="hang", exc_type=Failure.CELL_TIMEOUT, exc_msg="reference/compare timed out")
        elif os.WIFSIGNALED(status):
            why = f"its process died: signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
        else:
            why = f"its process exited with code {os.WEXITSTATUS(status)}"
        return dict(status="error", exc_type=Failure.HARNESS_ERROR, exc_msg=f"reference/compare failed: {why}")

    def fork(self, request: dict[str, Any]) -> int | None:
        """The pid of a new process serving ``request`` (a cell's or a reference's); None when
        the zygote is gone."""
        try:
            os.write(self.requests, (json.dumps(request) + "\n").encode())
        except OSError:
            return None
        deadline = time.time() + 30
        while (reply := self._read(deadline)) is not None:
            if reply.startswith("pid "):  # (a late status of a killed cell process is skipped)
                return int(reply.split()[1])
        return None

    def wait(self, pid: int, deadline: float) -> int | None:
        """The cell process's wait status; None when it overstayed (it is killed) or the zygote is gone."""
        reply = self._read(deadline)
        if reply is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            reply = self._read(time.time() + 10)  # the zygote reaps it and reports
            return None
        return int(reply.split()[1]) if reply.startswith("status ") else None

    def _read(self, deadline: float) -> str | None:
        while b"\n" not in self._buffer:
            left = deadline - time.time()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.replies], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.replies, 4096)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


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
def _serve(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, requests: int, replies: int) -> None:
    """The zygote: fork a cell process per request, report its pid and wait status."""
    code = 0
    try:
        die_with_parent()
        faulthandler.disable()  # the worker reports a cell process's death; the launch is not over
        with os.fdopen(requests, "r") as lines:
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os.close(replies)
                    if request.pop("kind") == "reference":
                        _reference_process(plan, scenarios, **request)
                    _cell_process(plan, scenarios, baseline, **request)
                os.write(replies, f"pid {pid}\n".encode())
                _, status = os.waitpid(pid, 0)
                os.write(replies, f"status {status}\n".encode())
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _cell_process(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, *, index: int, slot_rank0: int,
                  rank: int, t0: float) -> None:
    from harness.rank.cell import CellRun

    code = 4
    CLOCK.reset()
    try:
        die_with_parent()
        gc.freeze()
        world = int(os.environ["WORLD_SIZE"])
        run = CellRun(plan=plan, store=peers.connect_store(world, client_only=True), forked=True, baseline=baseline,
                      watchdog=Watchdog(plan.stamp_file(slot_rank0 + rank), on_expire=peers.unblock), scenarios=scenarios)
        code = 0 if run.run_here(plan.cell(index), slot_rank0=slot_rank0, rank=rank, t0=t0) else 3
    except BaseException:
        traceback.print_exc()
    finally:
        CLOCK.write(plan.phase_times_file(slot_rank0 + rank, cell=index), launch=plan.launch_id, rank=slot_rank0 + rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reference_process(plan: LaunchPlan, scenarios: dict, *, index: int, installs: dict) -> None:
    """The reference and the comparison of cell ``index``, written to ``plan.verdict_file``."""
    from harness.rank.judging import check_against_reference, load_observed, scenario_for

    code = 4
    CLOCK.reset()
    cell = plan.cell(index)
    try:
        die_with_parent()
        gc.freeze()
        try:
            fields = check_against_reference(scenario_for(scenarios, cell), load_observed(plan.observed_file(index)),
                                             cell, installs, references=plan.references_folder())
        except Exception as e:  # a broken reference must not lose the cell
            fields = dict(status="error", exc_type=type(e).__name__, exc_msg=f"reference/compare failed: {e}"[:500],
                          traceback=traceback.format_exc()[-8000:])
        plan.verdict_file(index).write_text(json.dumps(fields, default=str))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        CLOCK.write(plan.phase_times_file(int(os.environ.get("RANK", "0")), cell=index, what="reference"),
                    launch=plan.launch_id)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
