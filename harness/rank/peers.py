"""How the ranks of a cell agree on its outcome, through torchrun's store (never through
the cell's own process group, which a failure may have broken).

Each rank posts a ``RankOutcome``; rank 0 collects them, blames the root cause, and
marks the cell recorded. A rank that failed while a peer is blocked in a collective
shuts its collective sockets so that peer fails at once instead of at the timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness.protocol import CellKeys, phase_key
from harness.rank.deadlock import socket_fds
from harness.rank.watchdog import CellTimeout, Watchdog
from harness.results.outcome import CellOutcome
from harness.vocabulary import Failure

__all__ = ["RankOutcome", "blame", "collect_outcomes", "connect_store", "failure", "post", "shutdown_peer_sockets",
           "unblock", "wait"]

_COMM_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
_TIMEOUT_MARKERS = ("timed out", "Timed out", "timeout after", "Timeout")


@dataclass(kw_only=True)
class RankOutcome:
    rank: int
    ok: bool
    exc_type: str | None = None
    exc_msg: str | None = None
    traceback: str | None = None
    t_fail: float | None = None
    #: where the rank was when it failed (``harness.rank.watchdog``): its phase, the innermost
    #: frame at the deadline, and whether that frame was waiting in a collective
    phase: str | None = None
    where: str | None = None
    in_collective: bool | None = None
    #: process-wide state the cell left changed on this rank (``harness.rank.state``), put back
    left_state: list[str] = field(default_factory=list)
    #: the sequence number of the default group after the cell (``harness.rank.groups``); None: no group
    group_seq: int | None = None
    #: the outcome of a cell that did not train (a skip, a patch install error), decided by this rank (``CellOutcome.to_json``)
    prepared: dict[str, Any] | None = None
    #: the judging rank's: its patch set's install outcomes, the torch functions and methods the
    #: install replaced (``harness.rank.leaks``), and whether it saved what FSDP2 produced
    #: (``LaunchPlan.observed_file``) for the reference
    patch_install: dict[str, dict[str, str]] = field(default_factory=dict)
    patch_changes: list[str] = field(default_factory=list)
    observed: bool = False
    #: the watchdog ended the cell before its deadline: blocked in a collective after every peer finished it
    deadlock: bool = False
    #: the module under test's code that ran on this rank in the cell, id -> digest (``harness.undertest.code_ran``)
    code_ran: dict[str, str] = field(default_factory=dict)

    @property
    def comm_failure(self) -> bool:
        return any(m in (self.exc_msg or "") for m in _COMM_FAILURE_MARKERS)

    @property
    def timed_out(self) -> bool:
        return self.exc_type == Failure.CELL_TIMEOUT or any(m in (self.exc_msg or "") for m in _TIMEOUT_MARKERS)


def connect_store(world: int, *, client_only: bool = False) -> dist.Store:
    """A client of the store torchrun's agent hosts (or rank 0 hosts one without an agent)."""
    use_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=(not use_agent and not client_only and int(os.environ["RANK"]) == 0),
        timeout=datetime.timedelta(seconds=120), wait_for_workers=False,
    )


def post(store: dist.Store, keys: CellKeys, outcome: RankOutcome, done: Path | None = None) -> None:
    """Post this rank's outcome; ``done``: the file where peers' watchdogs see it posted (``harness.rank.watchdog``)."""
    store.set(keys.status(outcome.rank), json.dumps(asdict(outcome)))
    if done is not None:
        with contextlib.suppress(OSError):  # only a certain hang's early end depends on it
            done.write_text(str(keys.index))


def collect_outcomes(store: dist.Store, keys: CellKeys, world: int, timeout_s: float) -> tuple[list[RankOutcome], list[int]]:
    """Every rank's outcome, waiting at most ``timeout_s`` in all; and the ranks that never reported."""
    deadline = time.time() + timeout_s
    outcomes: list[RankOutcome] = []
    missing: list[int] = []
    for r in range(world):
        key = keys.status(r)
        if not wait(store, [key], max(1.0, deadline - time.time())):
            missing.append(r)
            continue
        outcomes.append(RankOutcome(**json.loads(store.get(key))))
    return outcomes, missing


def wait(store: dist.Store, keys: list[str], timeout_s: float) -> bool:
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        return True
    except Exception:
        return False


def blame(outcomes: list[RankOutcome], missing: dict[int, str | None], timeout_s: float) -> CellOutcome:
    """The cell's outcome: its root cause.

    A rank's own error beats a peer's connection loss. A hang (the deadline passed) is
    blamed on the ranks that did not arrive: those that never reported, else those whose
    phase is furthest behind; the message says where every rank was.
    """
    failed = [o for o in outcomes if not o.ok]
    rank_errors = {str(o.rank): f"{o.exc_type}: {o.exc_msg}" for o in failed}
    # a forked cell's process killed by a signal, or ended by user code's os._exit
    dead = [o for o in failed if o.exc_type in (Failure.SIGNAL, Failure.EXIT_CODE)]
    if dead:
        first = min(dead, key=lambda o: (o.t_fail or 0.0, o.rank))
        return CellOutcome(status="crash", exc_type=first.exc_type, exc_msg=first.exc_msg, failing_rank=first.rank,
                           traceback=first.traceback, failed_ranks=sorted({o.rank for o in failed} | set(missing)),
                           rank_errors=rank_errors)
    own = [o for o in failed if not o.comm_failure and not o.timed_out]
    phases = {o.rank: o.phase for o in outcomes} | missing
    fields: dict[str, Any] = dict(failed_ranks=sorted({o.rank for o in failed} | set(missing)), rank_errors=rank_errors)
    if own or not (missing or any(o.timed_out for o in failed)):
        primary = sorted(own or failed, key=lambda o: (o.comm_failure, o.t_fail or 0.0, o.rank))[0]
        return CellOutcome(**fields, status="error", exc_type=primary.exc_type, exc_msg=primary.exc_msg,
                           failing_rank=primary.rank, traceback=primary.traceback)
    stuck_in_own_code = sorted(o.rank for o in failed if o.timed_out and o.in_collective is False)
    if missing:
        behind = sorted(missing)
    elif stuck_in_own_code and len(stuck_in_own_code) < len(phases):
        behind = stuck_in_own_code  # the others were waiting in a collective for them
    else:
        last = min(phase_key(p) for p in phases.values())
        behind = sorted(r for r, p in phases.items() if phase_key(p) == last and len(phases) > 1) or sorted(phases)
    where = "; ".join([*(_whereabouts(o) for o in sorted(failed, key=lambda o: o.rank)),
                       *(f"rank {r} never reported (last in {p!r})" for r, p in sorted(missing.items()))])
    primary = next((o for o in failed if o.rank == behind[0]), None)
    arrived = "" if len(behind) == len(phases) else " did not arrive"
    when = f"within {timeout_s:g} s"
    if any(o.deadlock for o in failed):  # certain before the deadline (``harness.rank.deadlock``)
        when = f"(a deadlock: every rank blocked with nothing running, {when})"
    return CellOutcome(**fields, status="hang", exc_type=Failure.CELL_TIMEOUT, failing_rank=behind[0],
                       exc_msg=f"no result {when}: rank(s) {behind}{arrived} ({where})",
                       traceback=primary.traceback if primary else None)


def _whereabouts(o: RankOutcome) -> str:
    if o.where:
        return f"rank {o.rank} {'waited in a collective' if o.in_collective else 'was'} in {o.where} during {o.phase!r}"
    if o.comm_failure:
        return f"rank {o.rank} lost its peers during {o.phase!r}"
    return f"rank {o.rank} failed during {o.phase!r}: {o.exc_type}"


def unblock() -> None:
    """At a cell's deadline: release this rank from a blocked collective (gloo: shut its
    sockets; NCCL: abort the communicators)."""
    shutdown_peer_sockets()
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None and dist.is_initialized() and dist.get_backend() != "gloo":
        try:
            abort()
        except Exception:
            pass


def shutdown_peer_sockets() -> bool:
    """Shut every TCP connection of this process except the one to torchrun's store.

    The failed cell's process group is already aborted and destroyed, but its sockets
    stay open while anything references it; a peer blocked in a collective on them then
    waits for the timeout. Returns whether any socket was shut (Linux: /proc/self/fd).
    """
    store_port = int(os.environ.get("MASTER_PORT", "0"))
    shut = False
    try:
        fds = socket_fds()
    except OSError:
        return False
    for fd in fds:
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                if s.getpeername()[1] != store_port:
                    s.shutdown(socket.SHUT_RDWR)
                    shut = True
        except OSError:
            pass  # not connected (a listener) or already closed
        finally:
            s.close()  # closes the duplicate only
    return shut


def failure(rank: int, e: BaseException, watchdog: Watchdog) -> RankOutcome:
    """This rank's outcome when its part of the cell raised ``e`` (the watchdog says where it was)."""
    lines = str(e).strip().splitlines()
    msg, fired = lines[0][:500] if lines else "", watchdog.fired
    if isinstance(e, CellTimeout):
        msg = (f"blocked for good in {watchdog.phase!r} (every rank of the slot was)" if watchdog.deadlock else
               f"the cell's deadline passed in {watchdog.phase!r}")
    elif isinstance(e, SystemExit):  # str(SystemExit(0)) is "0"
        msg = f"SystemExit {e.code} during {watchdog.phase!r}"
    return RankOutcome(rank=rank, ok=False, exc_type=Failure.CELL_TIMEOUT if fired else type(e).__name__, exc_msg=msg,
                             traceback=traceback.format_exc()[-8000:], t_fail=time.time(), phase=watchdog.phase,
                             where=watchdog.where if fired else None, in_collective=watchdog.in_collective if fired else None,
                             deadlock=fired and watchdog.deadlock)
