"""fsdp_patches.gloo_avg (bug M): which reductions it turns into sum-then-divide, on both
forms torch's divide-factor function has had (2.7: factors; 2.8: a force-sum flag)."""

from __future__ import annotations

import pytest

import fsdp_patches.gloo_avg as gloo_avg
from fsdp_patches import PATCHES, patch_fsdp_gloo_reduce_scatter_avg


class _Group:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def factors_2_7(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type=""):
    """torch 2.7's shape: (None, None) asks the backend for AVG; fp16 gets its own factors."""
    return (None, None) if reduce_dtype != "fp16" else (2.0, reduce_scatter_group.size() / 2.0)


def factors_2_8(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type="", factor=None,
                force_sum_reduction_for_comms=False):
    return ("forced" if force_sum_reduction_for_comms else "avg", reduce_scatter_group.size())


@pytest.fixture
def on_gloo(monkeypatch):
    monkeypatch.setattr(gloo_avg, "is_cpu_gloo", lambda group, device_type: device_type == "cpu")


def test_2_8_form_gets_the_force_sum_flag_on_cpu_gloo_only(on_gloo):
    assert gloo_avg.forced_sum(factors_2_8, _Group(4), None, "fp32", "cpu") == ("forced", 4)
    assert gloo_avg.forced_sum(factors_2_8, _Group(4), None, "fp32", device_type="cuda") == ("avg", 4)


def test_2_7_form_sums_then_divides_by_the_shard_group(on_gloo):
    assert gloo_avg.forced_sum(factors_2_7, _Group(4), None, "fp32", "cpu") == (1.0, 4.0)
    assert gloo_avg.forced_sum(factors_2_7, _Group(4), None, "fp16", "cpu") == (2.0, 2.0)  # fp16: its own factors
    assert gloo_avg.forced_sum(factors_2_7, _Group(4), None, "fp32", "cuda") == (None, None)


def test_2_7_hsdp_is_left_alone(on_gloo):
    """2.7's HSDP on gloo fails either way; the AVG error is the clearer one."""
    assert gloo_avg.forced_sum(factors_2_7, _Group(2), _Group(2), "fp32", "cpu") == (None, None)


def test_not_applicable_where_gloo_averages():
    from fsdp_patches._compat import torch_at_least

    result = patch_fsdp_gloo_reduce_scatter_avg()
    if torch_at_least(2, 9):
        assert result.status == "not-applicable" and "2.9" in result.reason
    else:
        assert result.status == "installed"
        result.undo()
    assert PATCHES["gloo_reduce_scatter_avg"] is patch_fsdp_gloo_reduce_scatter_avg


def test_is_cpu_gloo_on_a_real_group():
    import torch.distributed as dist

    assert not gloo_avg.is_cpu_gloo(None, "cpu")
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        assert gloo_avg.is_cpu_gloo(group, "cpu") and not gloo_avg.is_cpu_gloo(group, "cuda")
    finally:
        if created:
            dist.destroy_process_group()
