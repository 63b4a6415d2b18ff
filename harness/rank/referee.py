"""The referee: a process that computes cells' references, one after another
(``harness.rank.forked`` forks it from the rank's zygote and asks it for each reference).

Forked from the zygote, a copy of the worker taken before any scenario or patch code ran,
it never runs under the patch set it judges. It is kept from one reference to the next
because a pristine process pays torch's first-use costs on every reference (measured on the
59 world-size-1 and -2 vanilla references of the 2.13 suite: 14.8 s in a fresh fork each,
2.1 s in one process). Before each reference it takes the process-wide state
(``harness.rank.leaks.CellState``, and torch's attributes against the rank's ``baseline``)
and puts it back after; where anything had to be put back (a model factory that changed the
default dtype, replaced a torch function, registered a global hook), it answers and ends, and
the next reference gets a fresh referee, so no reference runs after a change a list might
have missed. ``--isolate fork``: a referee serves one reference.

The worker writes a request line (``{"index": cell, "installs": ...}``) to its pipe; the
referee writes the cell's outcome (``CellOutcome``) to ``LaunchPlan.verdict_file`` and answers
``done <cell> fresh`` (it serves on) or ``done <cell> spent`` (it ends).
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness.process import collector
from harness.process.tree import die_with_parent
from harness.protocol import KEPT_REFERENCES, LaunchPlan
from harness.rank.leaks import CellState, TorchAttributes
from harness.rank.phases import CLOCK

__all__ = ["Lines", "Referee", "serve_references"]


class Lines:
    """Lines from a pipe, read with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: the other end is closed: its process ended
        self.ended = False
        self._buffer = b""

    def read(self, deadline: float) -> str | None:
        """The next line; None at the deadline or at the end."""
        while b"\n" not in self._buffer:
            left = deadline - time.time()
            if left <= 0 or self.ended:
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    self.ended = True
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


@dataclass(kw_only=True)
class Referee:
    """The worker's end of a referee: a process that computes references, one after another."""

    pid: int
    requests: int
    replies: Lines


def serve_references(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, requests: int, replies: int, *,
                     one: bool, start: CellState | None = None) -> None:
    """A referee: the reference and the comparison of each cell the worker asks for, one after
    another, each written to ``plan.verdict_file``; answers "done <cell> fresh" or, where the
    reference left the process changed (or ``one``), "done <cell> spent" and ends. ``start``: the
    process-wide state its zygote took, as each reference starts with it."""
    code = 4
    try:
        die_with_parent()
        collector.freeze()
        with os.fdopen(requests, "r") as lines:
            for line in lines:
                request = json.loads(line)
                spent = not _judge_one(plan, scenarios, baseline, start=start, **request) or one
                os.write(replies, f"done {request['index']} {'spent' if spent else 'fresh'}\n".encode())
                if spent:
                    break
                collector.refreeze()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _judge_one(plan: LaunchPlan, scenarios: dict, baseline: TorchAttributes, *, start: CellState | None, index: int,
               installs: dict) -> bool:
    """The reference and the comparison of cell ``index``, written to ``plan.verdict_file``, then
    the process-wide state put back; False where anything had to be put back (the scenario's
    model factory changed the process: the referee ends rather than trust the put-back)."""
    from harness.rank.judging import check_saved
    from harness.train.reuse import References

    CLOCK.reset()
    cell = plan.cell(index)
    with CLOCK.timed("state"):
        before = start or CellState.take()
    references = References(launch=plan.references_folder(), kept=Path(plan.folder) / KEPT_REFERENCES,
                            read_kept=not plan.config.runs_everything)
    outcome = check_saved(scenarios, cell, plan.observed_file(index), installs, references=references)
    plan.verdict_file(index).write_text(json.dumps(outcome.to_json(), default=str))
    CLOCK.enter("state")
    left = [*before.settle(put_back=True), *baseline.restore()]
    CLOCK.write(plan.phase_times_file(int(os.environ.get("RANK", "0")), cell=index, what="reference"),
                launch=plan.launch_id)
    return not left
