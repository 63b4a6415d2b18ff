"""``fsdp_patches.meta_init`` (bug N): random init of a model built on the meta device and
sharded with ``fully_shard``, then ``to_empty`` and ``reset_parameters()``.

One subprocess (so the pytest process stays unpatched) joins a two-rank "fake" process
group as rank 1 (no peer needed: FSDP2 shards without a collective), builds a two-layer
model on the meta device, shards it, initialises it under a seed, and compares each local
shard with the rows a single process's init under that seed gives this rank: vanilla,
with ``meta_init_full_rng`` installed, and after undo. Rows 7..12 of a 13-row weight make
the shards uneven.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from fsdp_patches.meta_init import init_full_then_shard, is_sharded
from harness.scenario.sharding import Sharding

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent(
    """
    import json, warnings
    import torch, torch.distributed as dist
    from torch import nn
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import fsdp_patches

    warnings.simplefilter("ignore")
    RANK = 1
    dist.init_process_group("fake", store=FakeStore(), rank=RANK, world_size=2)
    mesh = init_device_mesh("cpu", (2,))

    def build():
        return nn.Sequential(nn.Linear(7, 13), nn.Linear(13, 3))

    def phase():
        torch.manual_seed(0)
        ref, next_draw = build(), torch.rand(4)
        with torch.device("meta"):
            model = build()
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        out = {"rng_in_step": torch.equal(torch.rand(4), next_draw)}
        for (name, p), r in zip(model.named_parameters(), ref.parameters()):
            local, full = p.to_local(), r.detach()
            rows = -(-full.shape[0] // 2)  # torch.chunk: rank 0 takes the larger half
            out[name] = {"own_rows": torch.equal(local, full[RANK * rows: RANK * rows + local.shape[0]]),
                         "first_rows": torch.equal(local, full[: local.shape[0]])}
        return out

    result = {"vanilla": phase()}
    installed = fsdp_patches.patch_fsdp_meta_init_full_rng()
    result["status"] = installed.status
    result["again"] = fsdp_patches.patch_fsdp_meta_init_full_rng().status
    result["patched"] = phase()
    installed.undo()
    result["undone"] = phase()
    result["restored"] = "uniform_" not in vars(torch.distributed.tensor.DTensor)
    dist.destroy_process_group()
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def rank1() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


NAMES = ("0.weight", "0.bias", "1.weight", "1.bias")


def test_vanilla_shards_repeat_the_start_of_the_stream(rank1: dict[str, Any]) -> None:
    vanilla = rank1["vanilla"]
    assert vanilla["0.weight"] == {"own_rows": False, "first_rows": True}  # rank 0's rows again
    assert not any(vanilla[n]["own_rows"] for n in NAMES)
    assert not vanilla["rng_in_step"]  # each rank advanced by its shard's size only


def test_patched_shards_are_slices_of_the_full_init(rank1: dict[str, Any]) -> None:
    assert (rank1["status"], rank1["again"]) == ("installed", "already-installed")
    assert all(rank1["patched"][n]["own_rows"] for n in NAMES)
    assert rank1["patched"]["rng_in_step"]  # the generator advanced as a single process's


def test_undo_brings_the_bug_back(rank1: dict[str, Any]) -> None:
    assert rank1["restored"]
    assert rank1["undone"] == rank1["vanilla"]


def test_plain_tensors_are_not_sharded() -> None:
    assert not is_sharded(torch.zeros(3))
    with pytest.raises(ValueError, match="expected a DTensor"):
        init_full_then_shard(torch.zeros(3), torch.nn.init.zeros_)


def test_sharding_init_is_checked() -> None:
    assert Sharding(init="meta").init == "meta"
    with pytest.raises(ValueError, match="Sharding.init"):
        Sharding(init="cuda")  # type: ignore[arg-type]
