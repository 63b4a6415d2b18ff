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
