"""Cell records: one JSON line per cell, appended and flushed to disk at once.

Written by rank 0 of a launch for cells that finished (pass, mismatch, error, skip, or
hang seen from inside), and by the launcher for cells whose launch hung or died.
The field list is the contract with ``harness.report`` and ``harness.verdict``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "append", "base", "environment", "finish", "mark_progress", "read_records", "torch_info"]

SCHEMA = 1


@functools.cache
def torch_info() -> dict[str, str | None]:
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
    }


@functools.cache
def environment() -> dict[str, Any]:
    import torch

    info = torch_info()
    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return {
        "python": platform.python_version(),
        "torch": info["torch"],
        "torch_build": f"cu{info['cuda'].replace('.', '')}" if info["cuda"] else "cpu",
        "cuda": info["cuda"],
        "gpu": gpu,
        "host": socket.gethostname(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "cpus": os.cpu_count(),
    }


def base(cell, scenario, expect, world_size: int, t0: float, *, run_id: str, patches_module: str) -> dict[str, Any]:
    """The fields every record has, before the outcome is known."""
    info = torch_info()
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "started_at": datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(timespec="seconds"),
        "scenario": cell.scenario,
        "variant": cell.variant,
        "patches_module": patches_module,
        "patches": list(scenario.patches) if scenario is not None else [],
        "installed_patches": list(cell.patches),
        "bug_observable": cell.device in scenario.bug_devices if scenario is not None else True,
        "patch_install": {},
        "torch": info["torch"],
        "torch_git": info["torch_git"],
        "device": cell.device,
        "backend": cell.backend,
        "world_size": world_size,
        "mesh": list(scenario.sharding.mesh_shape(world_size)) if scenario is not None else [world_size],
        "status": None,
        "expected": expect.status,
        "expected_match": expect.match,
        "as_expected": None,
        "exc_type": None,
        "exc_msg": None,
        "failing_rank": None,
        "traceback": None,
        "max_abs_diff": None,
        "max_rel_diff": None,
        "worst": None,
        "diffs": [],
        "grad_norm": None,
        "ref_grad_norm": None,
        "duration_s": None,
        "timeout_s": cell.timeout_s,
        "reason": expect.why or None,
        "env": environment(),
    }


def finish(rec: dict[str, Any], expect, t0: float) -> dict[str, Any]:
    """Fill duration and whether the outcome is the expected one."""
    rec["duration_s"] = round(time.time() - t0, 3)
    rec["as_expected"] = outcome_matches(rec, expect.status, expect.match)
    return rec


def outcome_matches(rec: dict[str, Any], status: str, match: str | None) -> bool:
    if rec["status"] == "skip":
        return True
    if rec["status"] not in status.split("|"):
        return False
    if match and rec["status"] != "pass":
        text = f"{rec.get('exc_msg') or ''}\n{rec.get('traceback') or ''}\n{rec.get('worst') or ''}"
        return match in text
    return True


def append(path: str | os.PathLike, rec: dict[str, Any]) -> None:
    """Append one record and force it to disk before returning."""
    line = json.dumps(rec, default=str) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def mark_progress(path: str | os.PathLike, index: int, event: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"cell": index, "event": event, "t": time.time()}) + "\n")
        f.flush()


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The well-formed records of one file (malformed lines are the report's business)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
