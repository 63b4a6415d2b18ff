"""What a run prints: a line per cell as it finishes, and the summary table at the end."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

from harness.results.record import Record
from harness.vocabulary import DEFAULT_MODULE

__all__ = ["Progress", "print_summary", "rerun_command", "say_start"]


def say_start(n_cells: int, out: Path, *, shuffle: int | None = None) -> None:
    order = "" if shuffle is None else f" (shuffled order, seed {shuffle})"
    print(f"{n_cells} cells -> {out}{order}", flush=True)


class Progress:
    def __init__(self) -> None:
        self.total, self.n, self.t0 = 0, 0, time.time()

    def __call__(self, rec: Record, total: int) -> None:
        self.n += 1
        flag = "" if rec.as_expected else f"  << UNEXPECTED (expected {'|'.join(rec.expected)})"
        if rec.left_state:  # process-wide state the cell left changed (put back before the next cell)
            flag += f"  [{'; '.join(rec.left_state)}]"
        detail = rec.exc_msg or rec.worst or rec.reason or ""
        if rec.reused_from:
            detail = f"reused from run {rec.reused_from.get('run_id')}: {detail}"
        label = f"{rec.scenario}[{rec.variant},{rec.device},w{rec.world_size}]"
        print(f"[{self.n}/{total}, {total - self.n} left, {time.time() - self.t0:5.1f}s] {label:<52} {rec.status:<8} "
              f"{rec.duration_s or 0:5.2f}s  {detail[:90]}{flag}", flush=True)


def print_summary(records: list[Record], *, shuffle: int | None = None) -> None:
    if shuffle is not None:
        print(f"cells ran in a shuffled order (seed {shuffle}; the same order again: --shuffle {shuffle})", flush=True)
    if not records:
        return
    header = f"{'scenario':<30} {'variant':<8} {'device':<6} {'ws':>2}  {'status':<8} {'expected':<16} ok  detail"
    print(f"\n{header}\n{'-' * len(header)}")
    for r in sorted(records, key=lambda r: (r.scenario, r.variant != "vanilla", r.device, r.world_size)):
        detail = r.exc_msg or (f"max|diff| {r.max_abs_diff:.2e} at {r.worst}" if r.max_abs_diff is not None else "")
        if r.fault:
            detail = f"fault {r.fault}: " + (f"missed {', '.join(r.fault_missed)}" if r.fault_missed else detail)
        print(f"{r.scenario:<30} {r.variant:<8} {r.device:<6} {r.world_size:>2}  {r.status:<8} "
              f"{'|'.join(r.expected):<16} {'yes' if r.as_expected else 'NO':<3} {(detail or r.reason or '')[:100]}")
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    reused = sum(bool(r.reused_from) for r in records)
    again = f" ({reused} reused: inputs unchanged since an as-expected record; --fresh runs them)" if reused else ""
    print(f"\n{len(records)} cells: {summary}; {sum(not r.as_expected for r in records)} not as expected{again}",
          flush=True)


def rerun_command(req: Any, world: int) -> str:
    """The command that reproduces a ``repro`` cell (its ``ReproRequest``) at ``world`` ranks."""
    config = req.config
    parts = [sys.executable, "-m", "harness", "repro", req.scenario, "--world-size", str(world),
             "--variant", req.variant, "--device", req.device]
    if req.variant != "vanilla" or config.patches != DEFAULT_MODULE:
        parts += ["--patches", config.patches]
    for name, func in config.patch_mapping.items():
        parts += ["--patch-map", f"{name}={func}"]
    for d in config.scenario_dirs:
        parts += ["--scenarios-dir", d]
    return " ".join(shlex.quote(p) for p in parts)
