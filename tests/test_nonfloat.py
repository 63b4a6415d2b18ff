"""Bug Q's patch on torch 2.7: a group's dtype resolution leaves frozen non-float parameters out."""

from types import SimpleNamespace

import torch

from fsdp_patches.nonfloat import _counts_frozen_params, _without_frozen_nonfloat


class _Param:
    def __init__(self, dtype: torch.dtype, requires_grad: bool) -> None:
        self.sharded_param = torch.zeros(2, dtype=dtype).requires_grad_(requires_grad)
        self.inits = 0

    def init_dtype_attrs(self, policy) -> None:
        self.inits += 1


def test_frozen_nonfloat_params_are_left_out_of_the_dtype_resolution_and_put_back():
    codes, weight, frozen_half = _Param(torch.uint8, False), _Param(torch.float32, True), _Param(torch.float16, False)
    group = SimpleNamespace(fsdp_params=[codes, weight, frozen_half], mp_policy=None)
    seen = []
    _without_frozen_nonfloat(lambda g: seen.append(list(g.fsdp_params)), group)
    assert seen == [[weight, frozen_half]]  # a frozen float parameter of another dtype still counts
    assert group.fsdp_params == [codes, weight, frozen_half]
    assert codes.inits == 1  # its dtype attributes are still set


def test_a_group_without_frozen_nonfloat_params_is_resolved_as_is():
    params = [_Param(torch.float32, True), _Param(torch.bfloat16, False)]
    group = SimpleNamespace(fsdp_params=params, mp_policy=None)
    seen = []
    _without_frozen_nonfloat(lambda g: seen.append(g.fsdp_params), group)
    assert seen == [params] and all(p.inits == 0 for p in params)


def test_the_resolution_that_counts_frozen_params_is_told_apart():
    def counts_all(self):
        return {p.orig_dtype for p in self.fsdp_params}

    def counts_trainable(self):
        return {p.orig_dtype for p in self.fsdp_params if p.sharded_param.requires_grad}

    assert _counts_frozen_params(counts_all) and not _counts_frozen_params(counts_trainable)
