"""What one rank holds after each optimizer step: live tensors, their bytes, CUDA memory.

A leak inside an optimizer step (a tensor kept per step in a cache, a state tensor created
anew each step) leaves the parameters right, so the comparison with the reference cannot see
it. After every ``optimizer.step()`` the FSDP2 side takes a ``StepResources``: the torch
tensors the garbage collector tracks (``gc.get_objects()``, every Python-visible tensor,
DTensors and their local tensors included), the bytes of their distinct storages, and on
CUDA ``torch.cuda.memory_allocated()`` (which also sees tensors no Python object holds).
The harness's own snapshot copies grow by design every step; the tensors reachable from
them are left out (``exclude``).

Stored compactly in the cell's record (``Record.resources``: one row per step). A scenario
that lists ``harness.train.checks.ResourceGrowth`` (``Scenario.checks``) turns a passing cell into a mismatch when the
rows grow every step after a warm-up (``growth_problems``; ``worst`` says "resources: ...").
Only such cells measure, and only on rank 0 (whose record it is); ``FSDP_COMPAT_RESOURCES=all``
measures every cell (the rows are stored, no verdict changes), ``=0`` none (``enabled``).
"""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MIN_STEPS", "StepResources", "growth_problems", "enabled", "measure", "tensor_ids"]

#: the fewest steps a growth finding needs: a warm-up step (optimizer state appears) and three more
MIN_STEPS = 4


@dataclass(kw_only=True, frozen=True)
class StepResources:
    """One rank's live tensors after an optimizer step."""

    step: int
    #: torch.Tensor objects the garbage collector tracks (DTensors and their local tensors each count)
    tensors: int
    #: bytes of the distinct storages of those tensors (wrapper subclasses have none of their own)
    bytes: int
    #: ``torch.cuda.memory_allocated()`` on the cell's device; None on CPU
    cuda_allocated: int | None = None

    def row(self) -> list[int | None]:
        """The compact form stored in ``Record.resources``."""
        return [self.step, self.tensors, self.bytes, self.cuda_allocated]

    @classmethod
    def from_row(cls, row: list[Any]) -> StepResources:
        if len(row) != 4:
            raise ValueError(f"a resources row has 4 fields (step, tensors, bytes, cuda_allocated), not {row!r}")
        return cls(step=int(row[0]), tensors=int(row[1]), bytes=int(row[2]),
                   cuda_allocated=None if row[3] is None else int(row[3]))


def enabled(wanted: bool) -> bool:
    """Whether a cell measures: where its scenario opts in (``FSDP_COMPAT_RESOURCES=0``: nowhere,
    ``=all``: every cell). Not every cell by default: a measurement walks every object the
    garbage collector tracks (tens of milliseconds per step in a worker; see ``measure``)."""
    env = os.environ.get("FSDP_COMPAT_RESOURCES", "")
    return env == "all" or (wanted and env != "0")


def tensor_ids(*containers: Any) -> set[int]:
    """The ids of the tensors inside nested dicts, lists, tuples and dataclass-like objects."""
    seen: set[int] = set()
    found: set[int] = set()
    stack = list(containers)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.add(id(obj))
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
    return found


def measure(step: int, *, device: torch.device | None = None, exclude: Iterable[Any] = ()) -> StepResources:
    """This process's live tensors now, less those reachable from ``exclude``. Garbage in
    reference cycles is collected first: the collector still lists it until a collection
    runs, at moments of its own, so uncollected garbage made the count rise or fall with
    the collector's timing (seen: a per-step leak judged "pass" on a loaded machine)."""
    gc.collect()
    skip = tensor_ids(*exclude)
    count = 0
    storages: dict[tuple[str, int], int] = {}
    for obj in _live_tensors():
        if id(obj) in skip:
            continue
        count += 1
        try:
            storage = obj.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
        except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass (DTensor) or a meta/fake tensor
            continue
        if key[1] != 0:
            storages[key] = storage.nbytes()
    cuda = None
    if device is not None and device.type == "cuda":
        cuda = int(torch.cuda.memory_allocated(device))
    return StepResources(step=step, tensors=count, bytes=sum(storages.values()), cuda_allocated=cuda)


def _live_tensors() -> list[torch.Tensor]:
    """Every tensor the garbage collector tracks. The filter runs in C (``map``, ``compress``):
    a Python loop over the few hundred thousand objects of a worker costs several times more.
    By type, not ``isinstance``: that reads ``__class__``, which some module objects warn on."""
    objects = gc.get_objects()
    tensor_types = {t for t in set(map(type, objects)) if issubclass(t, torch.Tensor)}
    return list(itertools.compress(objects, map(tensor_types.__contains__, map(type, objects))))


def growth_problems(rows: list[list[Any]] | None, *, warmup: int = 1, min_steps: int = MIN_STEPS) -> list[str]:
    """Growth every step after the first ``warmup`` steps, over at least ``min_steps`` steps:
    one problem text per quantity (live tensors, bytes, CUDA allocated) that grew each time.
    None (not measured) or too few steps: no problems."""
    if not rows or len(rows) < min_steps or len(rows) - warmup < 2:
        return []
    steps = [StepResources.from_row(r) for r in rows][warmup:]
    problems = []
    for label, values in (("live tensors", [s.tensors for s in steps]), ("tensor bytes", [s.bytes for s in steps]),
                          ("CUDA allocated bytes", [s.cuda_allocated for s in steps])):
        if any(v is None for v in values):
            continue
        deltas = [b - a for a, b in zip(values, values[1:])]  # type: ignore[operator]
        if all(d > 0 for d in deltas):
            problems.append(f"{label} grew every step after step {steps[0].step}: "
                            f"from {values[0]} to {values[-1]} (+{min(deltas)} to +{max(deltas)} per step)")
    return problems
