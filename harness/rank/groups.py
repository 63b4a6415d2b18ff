"""A cell's process groups: the default group made for the cell, or kept from the slot's
previous cell, and every group destroyed once it can no longer be trusted.

Making a default group costs a rendezvous through the store and a connection between every
pair of the slot's ranks (gloo: TCP sockets; NCCL: a communicator, far more). Consecutive
cells of one slot in one stage, on the same backend and timeout, can share it, and
nothing else. A cell that made any other group (meshes of HSDP, tensor or expert
parallelism) tears everything down: torch's device-mesh bookkeeping keys meshes by
layout, so a later cell's equal mesh would find that cell's groups. The default group is
kept only when the slot's judge saw every rank succeed with the same number of collectives issued on it (its sequence
number, posted with the outcome, ``RankOutcome.group_seq``), so no rank can carry an
unmatched collective into the next cell. Otherwise every rank destroys it: a rank that
failed at once (aborting it first), the others when the judge says so
(``CellKeys.keep_group``). A cell that runs forked, a change of patch set (its undo puts
torch.distributed's module state back as it was) and the end of a stage release it too.

A destroyed group is freed one release later, not at once. Freeing a gloo group joins its
worker threads; a thread that is just dropping a finished collective whose tensor has a
Python object needs the GIL for that, and before torch 2.8 (pytorch/pytorch#154976) the
joining thread held it: torch 2.7.1 deadlocked so in ``destroy_process_group`` now and then
(``~ProcessGroupGloo`` against ``~AsyncAllgatherCoalescedWork`` waiting for the GIL, after
a cell's DTensor ``full_tensor``; before, ``~AsyncGatherWork`` after the harness's own
gather). A cell later no collective of those groups is in flight. A forked process never
frees the groups it inherited: their threads live in its parent.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch.distributed as dist

from harness.plan.cells import Cell

__all__ = ["CellGroups", "ProbeCache", "keep_group", "release"]


@dataclass(kw_only=True)
class CellGroups:
    """This process's default group between cells: what it was made for, and counts."""

    #: (backend, world size, first global rank of the slot, timeout) of the live default group
    kept: tuple[str, int, int, float] | None = None
    made: int = 0
    reused: int = 0

    def open(self, cell: Cell, *, slot_rank0: int, rank: int, store: dist.Store) -> bool:
        """The cell's default group: the kept one where it was made for the same slot,
        backend and timeout (True), else a new one over ``store``."""
        key = (cell.backend, cell.world_size, slot_rank0, float(cell.timeout_s))
        if self.kept == key and dist.is_initialized():
            self.reused += 1
            return True
        self.release()
        dist.init_process_group(backend=cell.backend, store=store, rank=rank, world_size=cell.world_size,
                                timeout=datetime.timedelta(seconds=cell.timeout_s))
        self.kept, self.made = key, self.made + 1
        return False

    def after_cell(self, *, failed: bool) -> int | None:
        """After this rank's part of a cell: on failure abort and destroy every group; else
        destroy all but the default group and return its sequence number (None: no group)."""
        if failed or not dist.is_initialized():
            self.release(failed=failed)
            return None
        try:
            default = dist.distributed_c10d._get_default_group()
            if any(group is not default for group in dist.distributed_c10d._world.pg_map):
                # torch's device-mesh bookkeeping maps meshes (hashed by layout, not identity)
                # to the groups a cell made: a later cell's equal mesh would find them
                # destroyed ("Could not resolve the process group registered under the name")
                # or, worse, another cell's. Only a whole-world teardown clears it.
                self.release()
                return None
            return int(default._get_sequence_number_for_group())
        except Exception:  # a backend without sequence numbers: not kept
            self.release(failed=True)
            return None

    def settle(self, *, keep: bool) -> None:
        """The judge's word on the cell: keep the default group for the slot's next cell, or not."""
        if not keep:
            self.release()

    def release(self, *, failed: bool = False) -> None:
        self.kept = None
        release(failed=failed)


@dataclass(kw_only=True)
class ProbeCache:
    """The gloo AVG probe's answers (``harness.train.probe.reduction_sums``), kept between cells.

    The answer depends on torch, the patch set in force, the backend, the shard group and the
    reduce dtype, not on which process group instance measured it, so it outlives groups. A
    rank that finds an answer skips the probe's collectives, so every rank of a slot must find
    the same: answers measured in a cell wait in ``pending`` until the judge says every rank of
    the cell trained without failing (``CellKeys.healthy``), and are dropped otherwise. Keys
    carry the slot (world size, first global rank), so ranks share answers only with the
    ranks they measured them with."""

    kept: dict[tuple, bool] = field(default_factory=dict)
    pending: dict[tuple, bool] = field(default_factory=dict)
    #: the patch set and slot of the cell now running (``begin``)
    scope: tuple = ()
    hits: int = 0

    def begin(self, patches: tuple[str, ...], *, world_size: int, slot_rank0: int) -> ProbeCache:
        """Scope lookups to the cell about to train."""
        self.pending.clear()
        self.scope = (patches, world_size, slot_rank0)
        return self

    def get(self, key: tuple) -> bool | None:
        found = self.kept.get((*self.scope, *key))
        self.hits += found is not None
        return found

    def put(self, key: tuple, sums: bool) -> None:
        self.pending[(*self.scope, *key)] = sums

    def settle(self, *, healthy: bool) -> None:
        if healthy:
            self.kept.update(self.pending)
        self.pending.clear()


#: (pid, groups) the last ``release`` destroyed, freed by the next one (the module docstring says why)
_DESTROYED: tuple[int, list] = (0, [])
#: groups a forked process inherited from its parent's last release: never freed here
_INHERITED: list = []


def release(*, failed: bool) -> None:
    """Destroy every group; after a failure abort them first (NCCL: frees communicators
    stuck in a collective; gloo peers are released by socket shutdown). The groups the
    previous release destroyed are freed now."""
    global _DESTROYED
    destroyed = []
    if dist.is_initialized():
        destroyed = list(dist.distributed_c10d._world.pg_map)
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if failed and abort is not None:
            try:
                abort()
            except Exception:
                pass
        if dist.is_initialized():
            dist.destroy_process_group()
    (pid, earlier), _DESTROYED = _DESTROYED, (os.getpid(), destroyed)
    if pid != os.getpid():
        _INHERITED.extend(earlier)
    del earlier  # the last reference to the previous release's groups: freed here


def keep_group(outcomes: list, missing: list[int]) -> bool:
    """Whether the slot may keep its default group: every rank reported, succeeded, and
    issued as many collectives on it as the others."""
    seqs = {o.group_seq for o in outcomes}
    return not missing and all(o.ok for o in outcomes) and len(seqs) == 1 and None not in seqs
