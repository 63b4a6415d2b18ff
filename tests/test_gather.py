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
