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


def _rehome_and_reduce(rank: int, store_path: str, world: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from fsdp_patches._grad_reduce import all_reduce
    from harness.rank.groups import release
    from harness.train.norm_group import rehome

    timeout = datetime.timedelta(seconds=GLOO_TIMEOUT_S)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world, timeout=timeout)
    mesh = init_device_mesh("cpu", (world,))
    param = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    param.grad = distribute_tensor(torch.full((4, 2), 2.0), mesh, [Shard(0)])
    before = len(dist.distributed_c10d._world.pg_map)
    restore = rehome([param], "cuda:gloo")
    stand_in = param.grad.device_mesh.get_group()
    assert stand_in._device_types == [torch.device("cuda")]
    total = all_reduce(param.grad.to_local().pow(2).sum(), "sum", stand_in, "cpu")  # as the clip patch does
    assert total.item() == 4 * 2 * 4.0
    restore()
    assert isinstance(param.grad, DTensor) and param.grad.device_mesh is mesh
    # the stand-in group is not destroyed (nor freed) as the clip returns: the cell's release does it,
    # freeing one release later (torch 2.7.1 deadlocked freeing a group a patch had just reduced over)
    assert stand_in in dist.distributed_c10d._world.pg_map and len(dist.distributed_c10d._world.pg_map) > before
    release(failed=False)
    assert not dist.is_initialized()


def test_the_clips_stand_in_groups_are_left_to_the_cells_release(tmp_path):
    run_ranks(_rehome_and_reduce, (str(tmp_path / "store"), 2), nprocs=2, timeout_s=90)
