"""The single-process reference: what FSDP2 should have produced.

It never initializes torch.distributed. Every data-parallel rank's forward is replayed
on that rank's data; the gradient of a window is the sum over micro-batches of the mean
over ranks, which is what FSDP2's reduce-scatter (and HSDP's all-reduce) compute.

Mixed precision is emulated, not tolerated: each rank's forward and backward run on a
copy of the model cast to ``param_dtype`` (inputs cast like FSDP2's root pre-forward),
and the per-rank gradients are upcast to ``reduce_dtype`` before they are averaged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness.snapshot import StepSnapshot
from harness.spec import Ctx, Scenario

__all__ = ["GLOO_AVG_SUMS", "quirks_for", "run_reference"]


#: Known backend behaviour the reference must model to judge anything else on that
#: backend: before torch 2.9 FSDP2 reduce-scatters fp32/bf16 grads with ReduceOp.AVG,
#: which gloo computes as a sum over the shard group (HSDP's replicate all-reduce still
#: averages, on 2.8; 2.7 rejects it). So grads come out ``shard size`` times too large on
#: CPU. Cells judged under a quirk say so in their record (``reference_quirks``).
GLOO_AVG_SUMS = "gloo reduce-scatter AVG sums (torch < 2.9): reference averages over the replicate dim only"


def quirks_for(*, torch_version: str, backend: str) -> list[str]:
    """The backend quirks that apply to a cell (see ``GLOO_AVG_SUMS``)."""
    from packaging.version import Version

    if "gloo" in backend and "nccl" not in backend and Version(Version(torch_version).base_version) < Version("2.9"):
        return [GLOO_AVG_SUMS]
    return []


def run_reference(scenario: Scenario, world_size: int, *, quirks: list[str] | None = None) -> list[StepSnapshot]:
    """Replay ``scenario`` at ``world_size`` data-parallel ranks in this process."""
    divisor = world_size
    if quirks and GLOO_AVG_SUMS in quirks:
        divisor = world_size // scenario.sharding.mesh_shape(world_size)[-1]
    torch.manual_seed(scenario.seed)
    model = scenario.model()
    named = dict(model.named_parameters())
    opt = scenario.optimizer.build(named.values())
    snapshots = []
    for step in range(scenario.steps):
        for k, micro_batch in enumerate(scenario.schedule):
            mean = _mean_over_ranks(scenario, model, world_size, step, k, divisor)
            for name, g in mean.items():
                p = named[name]
                p.grad = g.to(p.dtype) if p.grad is None else p.grad + g.to(p.dtype)
            if micro_batch.sync and scenario.unused_grads == "zero":
                for p in named.values():
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
        snapshots.append(_finish_step(scenario, step, named, opt))
    return snapshots


def _mean_over_ranks(
    scenario: Scenario, model: nn.Module, world_size: int, step: int, k: int, divisor: int
) -> dict[str, torch.Tensor]:
    """Mean over ranks of each parameter's gradient for micro-batch ``k`` (only used ones)."""
    compute_dtype = scenario.sharding.param_dtype
    reduce_dtype = scenario.sharding.reduce_dtype or compute_dtype or torch.float32
    total: dict[str, torch.Tensor] = {}
    for rank in range(world_size):
        ctx = Ctx(rank=rank, world_size=world_size, step=step, micro_batch=k)
        torch.manual_seed(scenario.batch_seed(ctx))
        batch = scenario.batch(ctx)
        replica = model
        if compute_dtype is not None:
            replica = copy.deepcopy(model).to(compute_dtype)
            if batch.is_floating_point():
                batch = batch.to(compute_dtype)
        names = [n for n, p in replica.named_parameters() if p.requires_grad]
        params = [p for _, p in replica.named_parameters() if p.requires_grad]
        loss = scenario.forward(replica, batch, ctx)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for name, g in zip(names, grads):
            if g is None:
                continue
            g = g.to(reduce_dtype)
            total[name] = g if name not in total else total[name] + g
    return {name: g / divisor for name, g in total.items()}


def _finish_step(scenario: Scenario, step: int, named: dict[str, nn.Parameter], opt: torch.optim.Optimizer) -> StepSnapshot:
    params = list(named.values())
    if scenario.grad_scale is not None:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scenario.grad_scale)
    snap = StepSnapshot(step=step, grads=_copy_grads(named))
    if scenario.clip is not None:
        with_grad = [p for p in params if p.grad is not None]
        total = torch.nn.utils.clip_grad_norm_(
            with_grad, scenario.clip.max_norm, scenario.clip.norm_type, foreach=False
        )
        snap.grad_norm = float(total)
        snap.clipped = _copy_grads(named)
    opt.step()
    snap.params = {n: p.detach().clone() for n, p in named.items()}
    snap.opt_state = {n: bool(opt.state.get(p)) for n, p in named.items()}
    opt.zero_grad(set_to_none=(step % 2 == 0))
    return snap


def _copy_grads(named: dict[str, nn.Parameter]) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in named.items()}
