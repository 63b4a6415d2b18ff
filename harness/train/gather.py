"""Gather full (unsharded) copies of a cell's sharded tensors onto its first rank.

Fast path, for DTensors whose local piece is one block of the full tensor at a global offset
(every ``Shard``/``Replicate`` placement: FSDP2 and HSDP; and FSDP2 over tensor or expert
parallel, ``_StridedShard`` then ``Shard``, where the cell's first snapshot verifies it, see
``Deferred.admit``): each rank copies its local pieces with their global offsets when a snapshot is
taken (``Deferred.capture``), and sends every snapshot of the cell in one
``gather_object`` at the end (``Deferred.flush``: the pieces' bytes packed into one
buffer per snapshot); the first rank writes them into full tensors. One collective per
cell instead of one per tensor or per snapshot (at 4 ranks on 2 cores each collective
waits for the slowest rank, and per-tensor all-gathers were most of a cell's time), and
no pickling of tensors one by one. Other layouts (``Partial``, a block ``admit`` could not
verify) take the general path: agree on presence, then ``full_tensor()`` each.

Both paths report grad presence that differs across ranks instead of desynchronizing. The
fast path also compares the pieces several ranks hold of the same region (HSDP's replicas):
they must be equal, and where they are not, the largest difference is reported
(``diverged``) instead of one replica silently overwriting the other.

Objects travel through ``_exchange`` (an all-gather of the pickled bytes' sizes, then of the
padded bytes), which also serves ``to_all`` for every rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = ["Deferred", "gather_full", "plain_placements"]

Full = dict[str, "torch.Tensor | None"]


def _exchange(obj: Any, *, rank: int, world: int, to_all: bool) -> list[Any] | None:
    """Every rank's ``obj`` (picklable), on every rank (``to_all``) or on rank 0 only (others: None).
    Collective on the default group."""
    import pickle

    device = torch.device("cpu")
    find = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    if find is not None:
        device = torch.device(find(None))
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.long, device=device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = int(max(int(s.item()) for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    outs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    if to_all:
        dist.all_gather(outs, padded)
    else:
        dist.gather(padded, outs if rank == 0 else None, dst=0)
    if not to_all and rank != 0:
        return None
    return [pickle.loads(out[:int(n.item())].cpu().numpy().tobytes()) for out, n in zip(outs, sizes)]


def plain_placements(params: list[torch.Tensor]) -> bool:
    """Whether every DTensor param is placed with plain ``Shard``/``Replicate`` (the fast path)."""
    return all(not isinstance(p, DTensor) or _plain(p.placements) for p in params)


def _plain(placements: Any) -> bool:
    return all(type(pl) in (Shard, Replicate) for pl in placements)


def gather_full(tensors: dict[str, torch.Tensor | None], *, rank: int, world: int,
                fast: bool) -> tuple[Full, dict[str, list[int]]]:
    """Full CPU copies by name on rank 0 (None where absent on some rank), and names whose
    presence differed across ranks with the ranks that had one. Other ranks get empty dicts.
    Collective: every rank of the cell calls it with the same names."""
    if not fast:
        return _general(tensors, rank, world)
    deferred = Deferred(rank=rank, world=world)
    out = deferred.capture(tensors)
    deferred.flush()
    return out


class Deferred:
    """Snapshots captured now and gathered later, all in one collective (fast path only).

    ``capture`` returns the snapshot's (full, inconsistent) dicts, empty until ``flush``
    fills them on rank 0 (other ranks keep them empty). Every rank captures the same
    snapshots with the same names, in the same order, then calls ``flush``."""

    def __init__(self, *, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.pending: list[tuple[list[str], tuple[dict[str, Any], bytes], Full, dict[str, list[int]],
                                 dict[str, float]]] = []
        #: (global shape, mesh id, placements) -> (the mesh, local shape, global offset): the same for every
        #: snapshot of a param, so computed once per cell (the mesh is held: its id is not reused meanwhile);
        #: layouts with other placements than ``Shard``/``Replicate`` only as ``admit`` verified them
        self.layouts: dict[tuple, tuple[Any, tuple[int, ...], tuple[int, ...]]] = {}

    def admit(self, params: list[torch.Tensor]) -> bool:
        """Whether every param's local piece is the block of the full tensor that
        ``compute_local_shape_and_global_offset`` names (then its snapshots take the fast path),
        verified once per layout that is not plain ``Shard``/``Replicate``: each rank holds the
        block of ``arange(numel)`` it claims, and ``full_tensor()`` of those blocks must give
        ``arange(numel)`` back. Collective (every rank of the cell, the same params in the same
        order); a grad takes its param's layout. False: keep to the general path."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        claims: list[tuple[torch.Tensor, tuple, tuple, tuple]] = []  # (param, key, local shape, offset)
        sized = True  # the claimed block has this rank's local shape: checked on every rank before any
        for p in params:  # collective, as a block of another size would abort gloo's all-gather
            if not isinstance(p, DTensor) or _plain(p.placements):
                continue
            key = (tuple(p.shape), id(p.device_mesh), tuple(p.placements))
            if key in self.layouts or any(c[1] == key for c in claims):
                continue
            try:
                shape, offset = (tuple(x) for x in compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                                         p.placements))
                inside = len(offset) == p.dim() and all(0 <= o and o + n <= d for o, n, d in zip(offset, shape, p.shape))
                sized = sized and inside and shape == tuple(p._local_tensor.shape)
            except Exception:  # a layout this torch cannot name that way: the general path
                shape, offset, sized = (), (), False
            claims.append((p, key, shape, offset))
        everyone = _exchange(sized, rank=self.rank, world=self.world, to_all=True)
        ok = bool(everyone) and all(everyone)
        for p, key, shape, offset in claims if ok else []:
            ids = torch.arange(p.numel(), dtype=torch.int64).reshape(p.shape)
            local = ids[_region(offset, shape)].contiguous()
            try:
                full = DTensor.from_local(local.to(p.device_mesh.device_type), p.device_mesh, p.placements,
                                          run_check=False, shape=p.shape, stride=p.stride()).full_tensor()
                ok = ok and torch.equal(full.cpu(), ids)
            except Exception:
                ok = False
            self.layouts[key] = (p.device_mesh, shape, offset)
        everyone = _exchange(ok, rank=self.rank, world=self.world, to_all=True)
        return bool(everyone) and all(everyone)

    def capture(self, tensors: dict[str, torch.Tensor | None],
                diverged: dict[str, float] | None = None) -> tuple[Full, dict[str, list[int]]]:
        """``diverged`` (filled at ``flush``): name -> the largest difference between replicas."""
        full: Full = {}
        inconsistent: dict[str, list[int]] = {}
        pieces = _pack({n: (None if t is None else _pieces(t, self.layouts)) for n, t in tensors.items()})
        self.pending.append((list(tensors), pieces, full, inconsistent, diverged if diverged is not None else {}))
        return full, inconsistent

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        everyone = _exchange([p[1] for p in pending], rank=self.rank, world=self.world, to_all=False)
        if everyone is None:
            return
        for k, (names, _, full, inconsistent, diverged) in enumerate(pending):
            _assemble(names, [_unpack(*everyone[r][k]) for r in range(self.world)], full, inconsistent, diverged)


def _pieces(t: torch.Tensor, layouts: dict) -> tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.Tensor]:
    """(global shape, dtype, global offset, the local piece on the CPU: not a copy where it is there already, as
    ``_pack`` copies every piece into the snapshot's buffer at once)."""
    if not isinstance(t, DTensor):
        return tuple(t.shape), t.dtype, (0,) * t.dim(), t.detach().to("cpu")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    # the local tensor itself, not through ``to_local``'s autograd function (a snapshot is detached)
    local = getattr(t, "_local_tensor", None)
    local, mesh, placements = t.to_local() if local is None else local, t.device_mesh, tuple(t.placements)
    key = (tuple(t.shape), id(mesh), placements)
    if key not in layouts:
        if _plain(placements):
            shape, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
            layouts[key] = (mesh, tuple(shape), tuple(offset))
        else:  # ``Deferred.admit`` verified every param's layout; a grad takes its param's (on an equal mesh)
            found = next((v for k, v in layouts.items() if k[0] == key[0] and k[2] == placements and v[0] == mesh), None)
            if found is None:
                raise RuntimeError(f"harness: a snapshot of a tensor placed {placements} on a layout no param of "
                                   f"the cell has (shape {tuple(t.shape)}): its pieces cannot be placed")
            layouts[key] = found
    _, shape, offset = layouts[key]
    assert tuple(local.shape) == shape, (tuple(local.shape), shape)
    return tuple(t.shape), t.dtype, offset, local.detach().to("cpu")


def _assemble(names: list[str], per_rank: list[dict[str, Piece | None]], full: Full,
              inconsistent: dict[str, list[int]], diverged: dict[str, float]) -> None:
    """Write each rank's pieces into full tensors (``full``); names present on some ranks
    only are None there and listed in ``inconsistent`` with the ranks that had one; pieces of
    one region that differ between ranks (replicas) go in ``diverged``."""
    world = len(per_rank)
    for name in names:
        have = [r for r in range(world) if per_rank[r][name] is not None]
        if len(have) < world:
            full[name] = None
            if have:
                inconsistent[name] = have
            continue
        shape, dtype, _, _ = per_rank[0][name]  # type: ignore[misc]
        out = torch.empty(shape, dtype=dtype)
        held: dict[tuple, torch.Tensor] = {}
        for r in range(world):
            _, _, offset, local = per_rank[r][name]  # type: ignore[misc]
            region = (tuple(offset), tuple(local.shape))
            if region in held and local.numel() and not torch.equal(held[region], local):
                gap = float((held[region].double() - local.double()).abs().nan_to_num(float("inf")).max())
                diverged[name] = max(diverged.get(name, 0.0), gap)
            held.setdefault(region, local)
            out[_region(offset, local.shape)] = local
        full[name] = out


Piece = tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.Tensor]


def _region(offset: tuple[int, ...], shape: Any) -> tuple[slice, ...]:
    """The index of the block of a full tensor at ``offset`` with ``shape``."""
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _pack(pieces: dict[str, Piece | None]) -> tuple[dict[str, Any], bytes]:
    """Pieces as (metadata, one buffer of their bytes)."""
    meta: dict[str, Any] = {}
    blobs: list[torch.Tensor] = []
    start = 0
    for name, piece in pieces.items():
        if piece is None:
            meta[name] = None
            continue
        shape, dtype, offset, local = piece
        blob = local.contiguous().reshape(-1).view(torch.uint8)
        meta[name] = (shape, dtype, offset, tuple(local.shape), start, blob.numel())
        blobs.append(blob)
        start += blob.numel()
    return meta, (torch.cat(blobs).numpy().tobytes() if blobs else b"")


def _unpack(meta: dict[str, Any], data: bytes) -> dict[str, Piece | None]:
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out: dict[str, Piece | None] = {}
    for name, m in meta.items():
        if m is None:
            out[name] = None
            continue
        shape, dtype, offset, local_shape, start, size = m
        # clone: a fresh, aligned storage for the view as ``dtype``
        local = buffer[start:start + size].clone().view(dtype).reshape(local_shape)
        out[name] = (shape, dtype, offset, local)
    return out


def _general(tensors: dict[str, torch.Tensor | None], rank: int, world: int) -> tuple[Full, dict[str, list[int]]]:
    have = _exchange([n for n, t in tensors.items() if t is not None], rank=rank, world=world, to_all=True)
    assert have is not None
    full: Full = {}
    inconsistent: dict[str, list[int]] = {}
    for name, t in tensors.items():
        ranks = [r for r in range(world) if name in have[r]]
        full[name] = _full_tensor(t) if len(ranks) == world else None
        if ranks and len(ranks) < world:
            inconsistent[name] = ranks
    return (full, inconsistent) if rank == 0 else ({}, {})


def _full_tensor(t: torch.Tensor | None) -> torch.Tensor:
    """A private CPU copy of the full tensor (collective for DTensors: every rank must call it)."""
    assert t is not None
    if isinstance(t, DTensor):
        local = t.to_local()
        mesh_device = t.device_mesh.device_type
        if local.device.type != mesh_device:  # CPU-offloaded shard: gather on the mesh device
            local = local.to(mesh_device)
        t = DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
        t = t.full_tensor()
    # clone: on a 1-rank shard dim the full tensor can alias the live grad or param
    return t.detach().to("cpu", copy=True)
