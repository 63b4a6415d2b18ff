"""``fsdp_patches.finalize`` (bug O): grads accumulated with gradient sync off are reduced
after the window, on a one-rank gloo group, for the root's and a child unit's parameters."""

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from fsdp_patches import finalize_backward


def _window(model: nn.Module, batches: list[torch.Tensor]) -> None:
    for x in batches:
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(False)
        model(x).square().mean().backward()


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))


def test_the_window_is_reduced_only_by_finalize_backward(one_rank_group):
    reference = _model()
    batches = [torch.randn(4, 7), torch.randn(4, 7)]
    _window(reference, batches)  # plain autograd: the sum over the window
    model = _model()
    fully_shard(model[0])
    fully_shard(model)
    _window(model, batches)
    model.set_requires_gradient_sync(True)  # what a stack without the utility does: reduces nothing
    assert all(p.grad is None for p in model.parameters())
    finalize_backward(model)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)
    _window(model, batches)  # the next window accumulates on top, and reduces again
    finalize_backward(model)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), 2 * q.grad, msg=name)


def test_it_wants_the_root_fsdp_module(one_rank_group):
    with pytest.raises(ValueError, match="not a fully_shard-ed module"):
        finalize_backward(nn.Linear(2, 2))
    model = _model()
    fully_shard(model[0])
    fully_shard(model)
    finalize_backward(model)  # before any forward: nothing to do
    _window(model, [torch.randn(2, 7)])
    with pytest.raises(ValueError, match="root FSDP module"):
        finalize_backward(model[0])
