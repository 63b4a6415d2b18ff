"""A reference is reused only by a cell that would compute the same one, bit for bit."""

import copy
import os

import torch

from harness.train.reuse import FROM_EARLIER_RUN, FROM_LAUNCH, References, reference_key, reused
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

    launch = References(launch=tmp_path)
    first, was = reused(launch, "k", compute)
    second, again = reused(launch, "k", compute)
    assert (was, again, len(calls)) == (None, FROM_LAUNCH, 1)
    assert torch.equal(first[1].grads["w"], second[1].grads["w"]) and second[0].grads["b"] is None
    assert reused(None, "k", compute)[1] is None and len(calls) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["k.pt"]  # no half-written file left
    (tmp_path / "bad.pt").write_bytes(b"half a file")  # not a reference: computed again, not the cell's error
    assert reused(launch, "bad", compute)[1] is None and reused(launch, "bad", compute)[1] == FROM_LAUNCH


def test_a_later_run_reads_the_kept_reference_unless_it_runs_everything(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return copy.deepcopy(_observed())

    kept = tmp_path / "kept"

    def launch(n, read_kept=True):
        return References(launch=tmp_path / f"L{n}.references", kept=kept, read_kept=read_kept)

    first, source = reused(launch(1), "k", compute)
    assert (source, len(calls)) == (None, 1)
    assert (kept / "k.pt").samefile(tmp_path / "L1.references" / "k.pt")  # one file, two names
    os.utime(kept / "k.pt", (1, 1))
    later, source = reused(launch(2), "k", compute)  # a later run: the kept one, its time renewed
    assert (source, len(calls)) == (FROM_EARLIER_RUN, 1) and (kept / "k.pt").stat().st_mtime > 1
    assert torch.equal(first[0].params["w"], later[0].params["w"]) and later[1].clipped["w"].dtype == torch.bfloat16
    assert reused(launch(2), "k", compute)[1] == FROM_LAUNCH  # and its launch's later cells find it there
    _, source = reused(launch(3, read_kept=False), "k", compute)  # --fresh: computed again
    assert (source, len(calls)) == (None, 2)
    assert reused(launch(3, read_kept=False), "k", compute)[1] == FROM_LAUNCH  # what this launch computed is read
    assert reused(launch(4), "other", compute)[1] is None and len(calls) == 3
    (kept / "bad.pt").write_bytes(b"half a file")  # unreadable: computed, and replaced
    assert reused(launch(5), "bad", compute)[1] is None and reused(launch(6), "bad", compute)[1] == FROM_EARLIER_RUN
    assert not [p for p in tmp_path.rglob("*.tmp")]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the kept folder should be")  # kept references cannot be written
    lone = References(launch=tmp_path / "L7.references", kept=blocked)
    assert reused(lone, "k7", compute)[1] is None and reused(lone, "k7", compute)[1] == FROM_LAUNCH
