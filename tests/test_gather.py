"""The fast gather's packing: every dtype, shape and absent piece comes back bit for bit."""

import pytest
import torch

from harness.train.gather import _pack, _unpack


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.bool])
def test_pieces_round_trip_through_one_buffer(dtype):
    g = torch.Generator().manual_seed(0)
    pieces = {
        "odd": ((5, 3), dtype, (2, 0), (torch.randn(3, 3, generator=g) * 10).to(dtype)),
        "absent": None,
        "empty_shard": ((1, 4), dtype, (1, 0), torch.empty(0, 4, dtype=dtype)),
        "scalar": ((), dtype, (), torch.tensor(7, dtype=dtype)),
        "strided": ((4, 2), dtype, (0, 0), torch.arange(8).reshape(2, 4).t().to(dtype)),  # not contiguous
    }
    back = _unpack(*_pack(pieces))
    assert back.keys() == pieces.keys() and back["absent"] is None
    for name, piece in pieces.items():
        if piece is None:
            continue
        assert back[name][:3] == piece[:3]
        assert back[name][3].dtype == dtype and torch.equal(back[name][3], piece[3]), name


def test_replicas_that_disagree_are_reported_not_overwritten():
    """HSDP: ranks 0 and 2 hold the same rows (replicas), as do 1 and 3. Equal replicas assemble
    silently; where one differs, the largest difference is named for that tensor."""
    from harness.train.gather import _assemble

    rows = torch.arange(8.0).reshape(4, 2)
    piece = {0: rows[:2], 1: rows[2:], 2: rows[:2].clone(), 3: rows[2:].clone()}
    per_rank = [{"w": ((4, 2), torch.float32, (0 if r % 2 == 0 else 2, 0), piece[r])} for r in range(4)]
    full, inconsistent, diverged = {}, {}, {}
    _assemble(["w"], per_rank, full, inconsistent, diverged)
    assert torch.equal(full["w"], rows) and diverged == {} and inconsistent == {}
    per_rank[3]["w"][3][1, 0] += 0.25  # rank 3's replica of rows 2-3 drifted
    _assemble(["w"], per_rank, full, inconsistent, diverged)
    assert diverged == {"w": 0.25}


def test_exchanged_objects_come_back_whole_to_rank_0_or_to_all(one_rank_group):
    from harness.train import gather

    sent = {"w": (1, 2.5, "x" * 1000)}
    assert gather._exchange(sent, rank=0, world=1, to_all=False) == [sent]
    assert gather._exchange(["a", "b"], rank=0, world=1, to_all=True) == [["a", "b"]]


def _tp_fsdp_rank(rank: int, port: int, out: str, rows: int, shift: int) -> None:
    """FSDP2 over tensor parallel on a ("dp", "tp") mesh of 4 CPU ranks: the weight is ``Shard(0)``
    over "tp", then ``fully_shard`` over "dp" places it ``_StridedShard`` then ``Shard``."""
    import json
    import os
    from datetime import timedelta

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from harness.train.gather import Deferred

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, rows, bias=False))
    model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh["tp"], [Shard(0)]))
    fully_shard(model, mesh=mesh["dp"])
    weight = model[0].weight
    if shift:  # a layout function that names the wrong block (past the end, or another rank's): caught
        import torch.distributed.tensor._utils as utils

        real = utils.compute_local_shape_and_global_offset
        utils.compute_local_shape_and_global_offset = lambda *a: (real(*a)[0], [(real(*a)[1][0] + shift) % rows, 0])
    deferred = Deferred(rank=rank, world=4)
    result = {"admitted": deferred.admit([weight]), "placements": [type(p).__name__ for p in weight.placements]}
    if result["admitted"]:
        full, inconsistent = deferred.capture({"w": weight, "g": None})
        deferred.flush()
        expected = weight.full_tensor()
        if rank == 0:
            result["equal"] = torch.equal(full["w"], expected) and full["g"] is None and inconsistent == {}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


@pytest.mark.parametrize(("rows", "shift"), [(8, 0), (10, 0), (8, 1), (8, 2)])
def test_fsdp_over_tensor_parallel_takes_the_fast_path_only_where_its_blocks_are_verified(tmp_path, rows, shift):
    """A ``_StridedShard`` layout (FSDP2 over TP) whose blocks ``admit`` verified is gathered in
    one collective and assembles to ``full_tensor()`` bit for bit (evenly and unevenly split);
    where the layout function names the wrong block (one past the end: the wrong size on the last
    rank, found before any collective; another rank's: found by ``full_tensor()``), every rank keeps
    to the general path."""
    import json
    import socket

    from tests.support import run_ranks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(_tp_fsdp_rank, (port, str(tmp_path), rows, shift), nprocs=4)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert results[0]["placements"] == ["_StridedShard", "Shard"]
    assert {r["admitted"] for r in results} == {not shift}  # every rank takes the same path
    if not shift:
        assert results[0]["equal"] is True
