"""``fsdp_patches.unfreeze`` (bug I): the feature check, the dtype fill on stand-in groups,
and a unit unfrozen after its first forward on a one-rank gloo group."""

import types

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import fsdp_patches
from fsdp_patches._compat import fsdp_param_group_class, torch_at_least
from fsdp_patches.unfreeze import drops_frozen_group_dtypes, fill_frozen_group_dtypes
from scenarios._unfreeze import Backbone

BF16, FP32 = torch.bfloat16, torch.float32
#: torch releases whose ``_init_mp_dtypes`` leave an all-frozen group without dtypes
AFFECTED = torch_at_least(2, 8) and not torch_at_least(2, 14)


def _param(orig, reduce, trainable=False):
    return types.SimpleNamespace(orig_dtype=orig, reduce_dtype=reduce,
                                 sharded_param=torch.zeros(1, dtype=orig, requires_grad=trainable))


def _group(*params, orig=None, reduce=None):
    return types.SimpleNamespace(fsdp_params=list(params), _orig_dtype=orig, _reduce_dtype=reduce)


def test_the_feature_check_finds_the_bug_exactly_on_2_8_to_2_13():
    assert drops_frozen_group_dtypes(fsdp_param_group_class()._init_mp_dtypes) is AFFECTED
    result = fsdp_patches.patch_fsdp_late_unfreeze_reduce_dtype()
    try:
        assert result.status == ("installed" if AFFECTED else "not-applicable"), result
    finally:
        result.undo()


def test_an_all_frozen_uniform_group_gets_its_parameters_dtypes():
    group = _group(_param(FP32, FP32), _param(FP32, FP32))
    assert fill_frozen_group_dtypes(group)
    assert (group._orig_dtype, group._reduce_dtype) == (FP32, FP32)


@pytest.mark.parametrize("group", [
    _group(_param(FP32, FP32), _param(BF16, None)),  # frozen, but two dtypes: stays unresolved, like 2.14
    _group(_param(FP32, FP32, trainable=True)),  # torch resolved it from the trainable parameter
    _group(_param(FP32, FP32), orig=BF16),  # already resolved
    _group(_param(torch.int64, None)),  # no floating-point parameter
], ids=["mixed-dtypes", "trainable", "resolved", "no-float"])
def test_other_groups_are_left_alone(group):
    before = (group._orig_dtype, group._reduce_dtype)
    assert not fill_frozen_group_dtypes(group)
    assert (group._orig_dtype, group._reduce_dtype) == before



def _unfreeze_after_first_forward() -> Backbone:
    model = Backbone()
    policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32)
    fully_shard(model.body, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model(torch.randn(5, 7)).float().square().mean().backward()  # body frozen: lazy init resolves dtypes
    model.body.requires_grad_(True)
    model(torch.randn(5, 7)).float().square().mean().backward()
    return model


@pytest.mark.skipif(not AFFECTED, reason="torch resolves all-frozen groups itself")
def test_vanilla_fails_and_the_patch_gives_fp32_grads_until_undone(one_rank_group):
    with pytest.raises(RuntimeError, match="attempting to assign a gradient with dtype"):
        _unfreeze_after_first_forward()
    result = fsdp_patches.patch_fsdp_late_unfreeze_reduce_dtype()
    assert result.status == "installed"
    assert fsdp_patches.patch_fsdp_late_unfreeze_reduce_dtype().status == "already-installed"
    model = _unfreeze_after_first_forward()
    assert model.body.weight.grad is not None and model.body.weight.grad.dtype == FP32
    assert result.undo() == ["FSDPParamGroup._init_mp_dtypes: restored"]
    with pytest.raises(RuntimeError, match="attempting to assign a gradient with dtype"):
        _unfreeze_after_first_forward()
