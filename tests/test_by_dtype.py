"""``fsdp_patches.by_dtype`` (bug K): which sub-modules become units of their own, and the
``fully_shard`` wrapper on a one-rank gloo group."""

import pytest
import torch
from torch import nn

import fsdp_patches
from fsdp_patches._compat import torch_at_least
from fsdp_patches.by_dtype import fully_shard_by_dtype, managed_params, patch_fsdp_shard_by_dtype, split_by_dtype
from scenarios._dtype_mix import LoraLinear, LoraNet, RoutedExperts

BF16 = torch.bfloat16


def test_lora_adapters_become_one_fp32_unit_per_layer():
    layer = LoraLinear(7, 13)
    assert split_by_dtype(layer) == {torch.float32: [layer.lora_a, layer.lora_b]}


def test_mixed_sub_modules_are_searched_for_uniform_ones():
    model = RoutedExperts()
    assert split_by_dtype(model) == {torch.float32: [model.moe.router]}


def test_uniform_modules_and_ignored_params_are_left_alone():
    assert split_by_dtype(nn.Linear(3, 3)) == {}
    layer = LoraLinear(7, 13)
    ignored = set(layer.lora_a.parameters()) | set(layer.lora_b.parameters())
    assert split_by_dtype(layer, ignored) == {}
    assert set(managed_params(layer, ignored)) == set(layer.base.parameters())


def test_the_dtype_of_the_module_itself_stays():
    module = nn.Linear(3, 3).to(BF16)
    module.side = nn.Linear(30, 30)  # more fp32 elements, but the module's own weight is bf16
    assert split_by_dtype(module) == {torch.float32: [module.side]}


def test_a_module_holding_two_dtypes_itself_cannot_be_split():
    module = nn.Linear(3, 3)
    module.bias = nn.Parameter(module.bias.detach().to(BF16))
    with pytest.raises(ValueError, match="holds parameters of dtypes"):
        split_by_dtype(module)
    parent = nn.Module()
    parent.big = nn.Linear(9, 9).to(BF16)
    parent.mixed = nn.Linear(2, 2)  # fp32 itself ...
    parent.mixed.inner = nn.Linear(2, 2).to(BF16)  # ... with bf16 below
    with pytest.raises(ValueError, match="mixed holds"):
        split_by_dtype(parent)



def test_adapters_kept_in_module_dicts_become_units_of_the_modules_that_run():
    """PEFT's layout: ``lora_A["default"]``. A ``ModuleDict`` is indexed, never called, so a unit
    hooked on it would stay sharded in forward (measured on 2.7.1: "got mixed torch.Tensor and
    DTensor"); the linears inside it are the unit."""
    from scenarios.k4_lora_peft_layout import PeftLoraLinear

    layer = PeftLoraLinear(7, 13)
    assert split_by_dtype(layer) == {torch.float32: [layer.lora_A["default"], layer.lora_B["default"]]}
    holder = nn.Module()
    holder.base = nn.Linear(9, 9).to(BF16)
    holder.extra = nn.ParameterDict({"scale": nn.Parameter(torch.ones(3))})  # indexed, and holds the params itself
    with pytest.raises(ValueError, match="has no forward of its own"):
        split_by_dtype(holder)


def _trains(model: nn.Module) -> None:
    model(torch.randn(5, 7)).float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_fully_shard_by_dtype_shards_a_trainable_mix(one_rank_group):
    from torch.distributed.fsdp import FSDPModule

    model = RoutedExperts()
    fully_shard_by_dtype(model)
    assert isinstance(model.moe.router, FSDPModule) and not isinstance(model.moe.experts[0], FSDPModule)
    _trains(model)


def test_the_patch_splits_only_what_torch_would_reject(one_rank_group):
    from torch.distributed.fsdp import FSDPModule

    assert patch_fsdp_shard_by_dtype().status == "installed"
    assert patch_fsdp_shard_by_dtype().status == "already-installed"
    model = RoutedExperts()
    torch.distributed.fsdp.fully_shard(model)
    assert isinstance(model.moe.router, FSDPModule)
    _trains(model)
    frozen = LoraNet()  # a frozen mix: rejected by torch 2.7 only
    torch.distributed.fsdp.fully_shard(frozen)
    counts_frozen = not torch_at_least(2, 8)
    assert isinstance(frozen.layers[0].lora_a, FSDPModule) == counts_frozen
    _trains(frozen)
    assert fsdp_patches.undo_all()["shard_by_dtype"] == ["fsdp.fully_shard: restored"]
    assert getattr(torch.distributed.fsdp.fully_shard, "__fsdp_compat_patch__", None) is None
