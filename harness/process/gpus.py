"""Which GPUs a launch may use.

Each pytest-xdist worker (or any process given a slot) takes a disjoint slice of the
visible GPUs sized to its cell's world size, so an 8-GPU runner runs four 2-rank cells
at once. A cell whose world size exceeds what its slice holds is skipped with a reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["gpu_slice", "skip_reason", "visible_gpus", "worker_slot"]


def visible_gpus(env: dict[str, str] | None = None) -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [g.strip() for g in value.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def worker_slot(env: dict[str, str] | None = None) -> tuple[int, int]:
    """(slot, slots) from pytest-xdist's worker id (``gw3`` of 4), or ``FSDP_COMPAT_SLOT=3/4``."""
    env = os.environ if env is None else env
    if "FSDP_COMPAT_SLOT" in env:
        slot, _, slots = env["FSDP_COMPAT_SLOT"].partition("/")
        return int(slot), int(slots)
    worker = env.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        return int(worker[2:]), int(env.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return 0, 1


def gpu_slice(gpus: list[str], slot: int, slots: int, world_size: int) -> list[str]:
    """The disjoint ``world_size`` GPUs of ``slot``; fewer (maybe none) when they run out.

    Slots share the GPUs in equal parts; slot ``i`` takes the first ``world_size`` of its
    part. With 8 GPUs and 4 slots, slot 2 of a 2-rank cell gets GPUs 4 and 5.
    """
    assert 0 <= slot < slots, (slot, slots)
    part = len(gpus) // slots if slots > 1 else len(gpus)
    start = slot * part
    return gpus[start : start + min(part, world_size)]


def skip_reason(device: str, world_size: int, gpus: list[str]) -> str | None:
    if device != "cuda":
        return None
    if world_size > len(gpus):
        return f"needs {world_size} GPUs, {len(gpus)} available to this worker"
    return None
