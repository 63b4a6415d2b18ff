"""fsdp_patches._grad_reduce (bug F's fix): a norm partial reduced over a group that serves no
device present here (``cuda:gloo`` on a CPU-only machine, the project's NCCL-only stand-in).

The reduction must not depend on state each rank holds for itself: a rank that made a group of
its own beforehand (here ``new_group([0], use_local_synchronization=True)`` on rank 0 only) once
made the fallback's name differ between members, and both waited under different names for the
fallback group's default timeout of 30 minutes."""

from __future__ import annotations

import datetime

import pytest

from tests.support import GLOO_TIMEOUT_S, run_ranks


def _reduce(rank: int, store_path: str, world: int, lonely_group: bool) -> None:
    import torch
    import torch.distributed as dist

    from fsdp_patches._grad_reduce import all_reduce

    timeout = datetime.timedelta(seconds=GLOO_TIMEOUT_S)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    # pairs {0,1} {2,3}: each reduces over its own pair, as HSDP's shard groups do
    pairs = [dist.new_group([r, r + 1], backend="cuda:gloo", timeout=timeout) for r in range(0, world, 2)]
    mine = pairs[rank // 2]
    if lonely_group and rank == 0:
        dist.new_group([0], backend="gloo", use_local_synchronization=True, timeout=timeout)
    value = torch.tensor([float(rank + 1)])
    total = all_reduce(value, "sum", mine, "cpu")
    biggest = all_reduce(value, "max", mine, "cpu")
    first = rank - rank % 2
    assert total.item() == (first + 1) + (first + 2), (rank, total)
    assert biggest.item() == first + 2, (rank, biggest)
    assert value.item() == rank + 1 and total.device == value.device
    dist.destroy_process_group()


@pytest.mark.parametrize("lonely_group", [False, True], ids=["same-groups", "one-rank-made-a-group-alone"])
def test_a_group_serving_no_present_device_reduces_over_its_own_ranks(lonely_group, tmp_path):
    run_ranks(_reduce, (str(tmp_path / "store"), 4, lonely_group), nprocs=4, timeout_s=90)


def test_a_group_with_no_usable_backend_is_one_clear_error():
    import torch

    from fsdp_patches import _grad_reduce

    class _NcclBackend:
        pass

    class _NcclOnly:  # an NCCL-only group where no GPU is present (cannot be made on this machine)
        _device_types = [torch.device("cuda")]

        def _get_backend(self, device):
            return _NcclBackend()

    with pytest.raises(RuntimeError, match="no backend of this process group can reduce"):
        _grad_reduce.reduction_target(_NcclOnly(), "cuda")
