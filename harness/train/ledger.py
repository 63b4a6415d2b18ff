"""The collective ledger of a cell: every collective the scenario's FSDP2 training issues.

Per step, micro-batch and phase (forward, backward, scale, clip, optimizer), each kind of
collective with its group size and dtype, how many were issued and their bytes. Stored
compactly in the cell's record (``Record.ledger``: one row per distinct key) so the report
can show where it changes between torch versions, and scenarios may declare checks on it
(``harness.train.checks.LedgerRules`` in ``Scenario.checks``; a violated rule makes the cell a mismatch, ``worst`` says
"ledger: ...").

Mechanism: while a ledger records, the collective functions of ``torch.distributed`` and of
``torch.distributed._functional_collectives`` (funcol) are replaced, as module attributes,
by counting wrappers, and put back afterwards. This holds across torch 2.7-2.15 because
FSDP2 calls its collectives through the module at call time (``dist.all_gather_into_tensor``
/ ``dist.reduce_scatter_tensor`` through 2.13's deprecation, ``dist.all_gather_single`` /
``dist.reduce_scatter_single`` from 2.13/2.14 on, ``dist.all_reduce`` for HSDP) and DTensor
redistributes (the clip norm's all-reduce) through ``funcol.<name>``. The collective methods of
c10d's ``ProcessGroup`` and ``Backend`` classes are wrapped too (``METHOD_KINDS``): a patch may
issue a collective on a group or on its backend directly (``group._get_backend(device).allreduce``,
as the project's bug-F patch does), which no function of the modules sees; every backend (gloo,
NCCL, the fake one) inherits these methods from ``Backend``. Renamed functions
map to one kind ("all_gather", "reduce_scatter"), so a rename is not a behaviour change;
a wrapper called from inside another (2.13's deprecated names forward to the new ones)
counts once, the outermost. ``CommDebugMode`` was not chosen: it is a dispatch mode, so it
runs Python on every aten op of the step (its cost is the op count, not the collective
count), and what it sees of FSDP2's c10d calls (not DTensor ops) has changed between
releases. The harness's own collectives (the presence all-gather, the snapshot gathers,
the reduction probe, barriers) are not counted: the FSDP2 side pauses the ledger around
them (``phase=None``). ``FSDP_COMPAT_LEDGER=0`` turns recording off (to measure its cost).

``bytes`` is the size of the full buffer a collective moves: the gathered output of an
all-gather, the input of a reduce-scatter, the tensor of an all-reduce or broadcast.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "KINDS",
    "METHOD_KINDS",
    "Entry",
    "Ledger",
    "LedgerCheck",
    "at_most",
    "check_problems",
    "recording",
]

#: function name -> kind, for the functions of torch.distributed and funcol that exist in some release
KINDS: dict[str, str] = {
    "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
    "all_gather": "all_gather", "all_gather_tensor": "all_gather", "all_gather_tensor_autograd": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_autograd": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "all_to_all_single": "all_to_all", "all_to_all": "all_to_all",
    "barrier": "barrier",
}
#: method name -> kind, for the collective methods of c10d's ``ProcessGroup`` and ``Backend`` in some release
METHOD_KINDS: dict[str, str] = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_single": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "barrier": "barrier",
}
#: kinds whose buffer is the output: a single gathered input is multiplied by the group size
_GATHERS = {"all_gather"}
_COLUMNS = ("step", "micro_batch", "phase", "kind", "group", "dtype", "count", "bytes")

LedgerCheck = Callable[["Ledger"], "str | None"]


@dataclass(kw_only=True, frozen=True)
class Entry:
    """Collectives of one kind, group size and dtype issued in one phase of one (micro-)step."""

    step: int
    micro_batch: int | None
    phase: str
    kind: str
    group: int
    dtype: str
    count: int
    bytes: int

    def row(self) -> list[Any]:
        return [getattr(self, c) for c in _COLUMNS]

    @classmethod
    def from_row(cls, row: list[Any]) -> Entry:
        if not isinstance(row, (list, tuple)) or len(row) != len(_COLUMNS):
            raise ValueError(f"a ledger row has {len(_COLUMNS)} columns {_COLUMNS}, got {row!r}")
        return cls(**dict(zip(_COLUMNS, row)))


@dataclass(kw_only=True)
class Ledger:
    """The entries of one cell, and where the scenario is (``phase=None``: not recording)."""

    entries: dict[tuple, list[int]] = field(default_factory=dict)
    step: int = 0
    micro_batch: int | None = None
    phase: str | None = None

    def at(self, phase: str | None, *, step: int | None = None, micro_batch: int | None = None) -> None:
        """Attribute what follows to ``phase`` (None pauses) of ``step`` / ``micro_batch``."""
        if step is not None:
            self.step = step
        self.phase, self.micro_batch = phase, micro_batch

    def add(self, kind: str, group: int, dtype: str, nbytes: int) -> None:
        if self.phase is None:
            return
        key = (self.step, self.micro_batch, self.phase, kind, group, dtype)
        slot = self.entries.setdefault(key, [0, 0])
        slot[0] += 1
        slot[1] += nbytes

    def list(self) -> list[Entry]:
        return [Entry(step=k[0], micro_batch=k[1], phase=k[2], kind=k[3], group=k[4], dtype=k[5], count=c, bytes=b)
                for k, (c, b) in self.entries.items()]

    def rows(self) -> list[list[Any]]:
        """The compact form stored in a record: one list per entry, in ``_COLUMNS`` order."""
        return [e.row() for e in self.list()]

    @classmethod
    def from_rows(cls, rows: list[list[Any]]) -> Ledger:
        led = cls()
        for e in map(Entry.from_row, rows):
            led.entries[(e.step, e.micro_batch, e.phase, e.kind, e.group, e.dtype)] = [e.count, e.bytes]
        return led

    def count(self, kind: str, *, phase: str | None = None, step: int | None = None,
              micro_batch: int | None = None) -> int:
        return sum(e.count for e in self.list() if e.kind == kind and (phase is None or e.phase == phase)
                   and (step is None or e.step == step) and (micro_batch is None or e.micro_batch == micro_batch))

    def summary(self) -> dict[str, dict[str, int]]:
        """Per step-independent key ``kind phase dtype gN``: collectives and bytes per step (the
        first step's; what the version comparison looks at)."""
        first = min((e.step for e in self.list()), default=0)
        out: dict[str, dict[str, int]] = {}
        for e in self.list():
            if e.step == first:
                slot = out.setdefault(f"{e.kind} {e.phase} {e.dtype} g{e.group}", {"count": 0, "bytes": 0})
                slot["count"] += e.count
                slot["bytes"] += e.bytes
        return dict(sorted(out.items()))


def at_most(kind: str, limit: int, *, phase: str) -> LedgerCheck:
    """A check: at most ``limit`` collectives of ``kind`` in ``phase`` of every micro-batch."""
    def check(led: Ledger) -> str | None:
        per: dict[tuple[int, int | None], int] = {}
        for e in led.list():
            if e.kind == kind and e.phase == phase:
                per[(e.step, e.micro_batch)] = per.get((e.step, e.micro_batch), 0) + e.count
        worst = max(per.items(), key=lambda kv: kv[1], default=None)
        if worst is not None and worst[1] > limit:
            (step, k) = worst[0]
            return f"{worst[1]} {kind} in {phase} of step {step} micro-batch {k}, expected at most {limit}"
        return None
    check.__doc__ = f"at most {limit} {kind} in {phase} per micro-batch"
    return check


def check_problems(checks: tuple[LedgerCheck, ...], rows: list[list[Any]] | None) -> list[str]:
    """The problems the scenario's checks find in a recorded ledger (none without one)."""
    if rows is None:
        return []
    led = Ledger.from_rows(rows)
    return [p for check in checks if (p := check(led))]


def enabled() -> bool:
    return os.environ.get("FSDP_COMPAT_LEDGER", "1") != "0"


_depth = threading.local()


def _group_size(group: Any) -> int:
    """The size of a c10d group or backend, a mesh, funcol's ``(mesh, dim)`` or a group name; -1 if unknown."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend
    from torch.distributed.device_mesh import DeviceMesh
    try:
        if group is None:
            return dist.get_world_size()
        if isinstance(group, (dist.ProcessGroup, Backend, DeviceMesh)):
            return group.size()
        if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
            return group[0].size(group[1])
        if isinstance(group, str):
            return dist.distributed_c10d._resolve_process_group(group).size()
    except Exception:
        pass
    return -1


def _is_group(arg: Any) -> bool:
    """A process group, a device mesh, or funcol's ``(mesh, dim)``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    return isinstance(arg, (dist.ProcessGroup, DeviceMesh)) or (
        isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], DeviceMesh))


def _tensor_list(a: Any) -> bool:
    return isinstance(a, (list, tuple)) and bool(a) and all(isinstance(t, torch.Tensor) for t in a)


def _buffer(kind: str, size: int, args: tuple, kwargs: dict) -> tuple[str, int]:
    """The dtype and bytes of a collective's full buffer (the module docstring says which)."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    joined = []  # a method's per-rank chunks, one inner list per tensor: [[chunk, ...]]
    for a in (*args, *kwargs.values()):
        if _tensor_list(a):
            tensors += list(a)
        elif isinstance(a, (list, tuple)) and a and all(map(_tensor_list, a)):
            joined += [(sum(t.numel() * t.element_size() for t in inner), inner[0]) for inner in a]
    big = max(tensors, key=lambda t: t.numel(), default=None)
    nbytes = 0 if big is None else big.numel() * big.element_size()
    if kind in _GATHERS and len(tensors) == 1 and not joined and size > 0:
        nbytes *= size
    whole = max(joined, key=lambda j: j[0], default=None)
    if whole is not None and whole[0] > nbytes:
        nbytes, big = whole
    return ("" if big is None else str(big.dtype).removeprefix("torch."), nbytes)


def _wrap(ledger: Ledger, kind: str, fn: Callable[..., Any], *, method: bool = False) -> Callable[..., Any]:
    """``fn`` counting its outermost calls; ``method``: a group's or backend's own (its size is ``self``'s)."""
    def counted(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth == 0 and ledger.phase is not None:
            group = args[0] if method else kwargs["group"] if "group" in kwargs else next(filter(_is_group, args), None)
            size = _group_size(group)
            ledger.add(kind, size, *_buffer(kind, size, args[1:] if method else args, kwargs))
        _depth.n = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth.n = depth
    counted.__wrapped__ = fn  # type: ignore[attr-defined]
    return counted


@contextmanager
def recording(ledger: Ledger | None = None) -> Iterator[Ledger | None]:
    """Count collectives into a ledger while the block runs (None where turned off); the
    wrapped functions are put back on exit, whatever happens in the block."""
    if not enabled():
        yield None
        return
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d
    from torch.distributed import _functional_collectives as funcol
    ledger = ledger if ledger is not None else Ledger()
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module in (dist, funcol):
            for name, kind in KINDS.items():
                fn = module.__dict__.get(name)
                if callable(fn):
                    saved.append((module, name, fn))
                    setattr(module, name, _wrap(ledger, kind, fn))
        for cls in (getattr(c10d, "ProcessGroup", None), getattr(c10d, "Backend", None)):
            for name, kind in METHOD_KINDS.items():
                fn = None if cls is None else cls.__dict__.get(name)
                if callable(fn):
                    saved.append((cls, name, fn))
                    setattr(cls, name, _wrap(ledger, kind, fn, method=True))
        yield ledger
    finally:
        for module, name, fn in reversed(saved):
            setattr(module, name, fn)
