"""Bug U's fix: ``fsdp_patches.set_reshard_after_forward`` (the backport of torch 2.8's setter)
and the ``ReshardAfterForward`` hook that changes a unit's value between steps (torch 2.13 CPU,
one rank)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from fsdp_patches import reshard
from harness.train.hooks import HookPoint, ReshardAfterForward
from harness.undertest.source import Utilities
from scenarios.u_weight_outside_forward import HeadLM


def _sharded() -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = HeadLM()
    fully_shard(model.head)
    fully_shard(model)
    return model


def _kept_after_forward(model) -> bool:
    """Whether the head's weight is still gathered (a plain tensor) after the model's forward."""
    model(torch.randint(0, 16, (2, 3)))
    return not isinstance(model.head.weight, DTensor)


def _backport_only(module, value, recurse=True):
    """The backport's own path, as on torch 2.7 (where the module has no public setter)."""
    reshard._set_post_forward(module, value, recurse)


def test_the_backport_sets_what_torchs_setter_sets(one_rank_group):
    model = _sharded()
    (group,) = reshard.param_groups_of_module(model.head)
    for value in (False, True, False):
        _backport_only(model.head, value, recurse=False)
        ours = group.post_forward_mesh_info
        model.head.set_reshard_after_forward(value, recurse=False)
        assert group.post_forward_mesh_info == ours
        assert (ours is None) is (not value)


def test_the_backport_keeps_the_head_gathered_and_lets_it_reshard_again(one_rank_group):
    model = _sharded()
    assert not _kept_after_forward(model)
    _backport_only(model.head, False, recurse=False)
    assert _kept_after_forward(model)
    _backport_only(model.head, True, recurse=False)
    assert not _kept_after_forward(model)


def test_recurse_false_leaves_the_other_units_alone(one_rank_group):
    model = _sharded()
    (root_group,) = reshard.param_groups_of_module(model)
    before = root_group.post_forward_mesh_info
    _backport_only(model.head, before is not None, recurse=False)
    assert root_group.post_forward_mesh_info == before


@pytest.mark.parametrize("route", ["api", "utility", "vanilla"])
def test_the_hook_toggles_the_unit_by_its_route(one_rank_group, route):
    model = _sharded()
    (group,) = reshard.param_groups_of_module(model.head)
    api = object() if route == "api" else None
    utilities = Utilities(set_reshard_after_forward=_backport_only if route == "utility" else None)
    at = HookPoint(root=model, step=0, api=api, utilities=utilities)
    hook = ReshardAfterForward("head")
    hook.begin_step(at)
    assert (group.post_forward_mesh_info is None) is (route != "vanilla")
    hook.end_window(at)
    assert group.post_forward_mesh_info is not None


def test_a_bad_value_or_module_is_one_clear_error(one_rank_group):
    with pytest.raises(ValueError, match="a bool"):
        reshard.set_reshard_after_forward(_sharded(), None)
    with pytest.raises(ValueError, match="not a fully_shard-ed module"):
        reshard.set_reshard_after_forward(torch.nn.Linear(2, 2), False)
