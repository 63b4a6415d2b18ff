"""A reference is reused only by a cell that would compute the same one, bit for bit."""

import copy

import torch

from harness.train.reuse import reference_key, reused
from harness.train.step import StepTensors


def _observed():
    g = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    return [StepTensors(step=s, grads={"w": g + s, "b": None}, params={"w": g * 2 + s},
                        clipped={"w": torch.zeros(2, 3, dtype=torch.bfloat16)}) for s in range(2)]


def test_the_key_sees_every_fed_tensor_bit_and_the_cells_words():
    base = reference_key("plain|full|False|cpu|2|[]", _observed())
    assert base == reference_key("plain|full|False|cpu|2|[]", _observed())
    for change in ("grad", "param", "clipped", "presence"):
        obs = _observed()
        if change == "grad":
            obs[1].grads["w"].view(-1)[4] = torch.nextafter(obs[1].grads["w"].view(-1)[4], torch.tensor(1.0))
        elif change == "param":
            obs[0].params["w"][0, 0] += 1e-30
        elif change == "clipped":
            obs[1].clipped["w"][1, 2] = 1
        else:
            obs[0].grads["b"] = torch.zeros(3)
        assert reference_key("plain|full|False|cpu|2|[]", obs) != base, change
    assert reference_key("plain|full|True|cpu|2|[]", _observed()) != base  # the api variant's recipe
    assert reference_key("plain|full|False|cpu|2|['gloo_avg_sum']", _observed()) != base


def test_the_first_computes_and_leaves_it_the_next_reads_it(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return copy.deepcopy(_observed())

    first, was = reused(tmp_path, "k", compute)
    second, again = reused(tmp_path, "k", compute)
    assert (was, again, len(calls)) == (False, True, 1)
    assert torch.equal(first[1].grads["w"], second[1].grads["w"]) and second[0].grads["b"] is None
    assert reused(None, "k", compute)[1] is False and len(calls) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["k.pt"]  # no half-written file left
    (tmp_path / "bad.pt").write_bytes(b"half a file")  # not a reference: computed again, not the cell's error
    assert reused(tmp_path, "bad", compute)[1] is False and reused(tmp_path, "bad", compute)[1] is True
