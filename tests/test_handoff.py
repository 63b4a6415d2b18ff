"""The judging rank's hand-off to its referee (``harness.rank.handoff``): every tensor comes back
equal, with its dtype and shape, whatever its layout; what it does not flatten is pickled as torch does."""

import pytest
import torch
from torch import nn

from harness.rank import handoff


def test_every_kind_of_tensor_comes_back_equal_with_its_dtype_and_shape(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    shared = torch.randn(5)
    obj = [{
        "step": 0, "note": "text", "norm": 1.5, "none": None,
        "grads": {"a": torch.randn(3, 7), "b": torch.randn(2, 2).to(torch.bfloat16), "c": torch.randn(9).half()},
        "other": {"int": torch.arange(5), "bool": torch.tensor([True, False, True]), "byte": torch.arange(3, dtype=torch.uint8),
                  "complex": torch.randn(3, dtype=torch.complex64), "double": torch.randn(2, dtype=torch.float64)},
        "layouts": {"zero_dim": torch.tensor(2.5), "empty": torch.empty(0, 4), "transposed": base.t(),
                    "slice": base[1:3, 2:5], "strided": base[:, ::2]},
        "twice": (shared, shared),
        "conj": torch.randn(3, dtype=torch.complex64).conj(), "sparse": torch.eye(3).to_sparse(),
        "grad": torch.ones(2, requires_grad=True), "param": nn.Parameter(torch.full((2,), 3.0)),
    }]
    handoff.save(obj, tmp_path / "h")
    back = handoff.load(tmp_path / "h")

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
            assert torch.equal(a.to_dense(), b.to_dense()) if a.is_sparse else torch.equal(a, b)
        elif isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                same(x, y)
        else:
            assert a == b

    same(obj, back)
    assert back[0]["twice"][0] is back[0]["twice"][1]  # one tensor held twice stays one
    back[0]["grads"]["a"].add_(1)  # views of one buffer: writing one leaves the others alone
    assert torch.equal(back[0]["grads"]["b"], obj[0]["grads"]["b"])


def test_a_snapshot_is_taken_when_saved_not_when_loaded(tmp_path):
    t = torch.zeros(4)
    handoff.save({"t": t}, tmp_path / "h")
    t.add_(1)
    assert torch.equal(handoff.load(tmp_path / "h")["t"], torch.zeros(4))


def test_a_truncated_hand_off_is_an_error_not_zeros(tmp_path):
    handoff.save({"t": torch.randn(1000)}, tmp_path / "h")
    data = (tmp_path / "h").read_bytes()
    (tmp_path / "h").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="shorter"):
        handoff.load(tmp_path / "h")


def test_loaded_with_copies_it_is_what_torch_save_and_load_keep(tmp_path):
    """``run --dump``: views of one buffer as several dtypes are refused by ``torch.save``; copies are not."""
    obj = {"fp32": torch.randn(3), "bf16": torch.randn(4).to(torch.bfloat16), "int": torch.arange(2)}
    handoff.save(obj, tmp_path / "h")
    with pytest.raises(RuntimeError):
        torch.save(handoff.load(tmp_path / "h"), tmp_path / "views.pt")
    torch.save(handoff.load(tmp_path / "h", copies=True), tmp_path / "dump.pt")
    back = torch.load(tmp_path / "dump.pt")
    assert all(torch.equal(back[k], obj[k]) and back[k].dtype == obj[k].dtype for k in obj)
