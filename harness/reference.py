"""The single-process reference: what FSDP2 should have produced.

It never initializes torch.distributed. Every data-parallel rank's forward is replayed
on that rank's data; the gradient of a window is the sum over micro-batches of the mean
over ranks, which is what FSDP2's reduce-scatter (and HSDP's all-reduce) compute. The
step loop itself is ``harness.recipe``'s, shared with the FSDP2 side.

The contract for unused parameters is plain autograd's, for every scenario: a parameter
that no rank used in an accumulation window has no grad (``None``), so AdamW neither
steps it nor creates state for it. A parameter some rank used gets the mean over ranks,
the others contributing zero.

Mixed precision is emulated, not tolerated: each rank's forward and backward run on a
copy of the model whose parameters (not buffers) are cast to ``param_dtype`` (inputs cast
like FSDP2's root pre-forward),
and the per-rank gradients are upcast to ``reduce_dtype`` before they are averaged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness import recipe
from harness.snapshot import StepSnapshot
from harness.spec import Clip, Ctx, MicroBatch, Scenario, move_batch, torch_release

__all__ = ["GLOO_AVG_SUMS", "ReferenceSide", "quirks_for", "run_reference"]


#: Known backend behaviour the reference must model to judge anything else on that
#: backend: before torch 2.9 FSDP2 reduce-scatters fp32/bf16 grads with ReduceOp.AVG,
#: which gloo computes as a sum over the shard group (HSDP's replicate all-reduce still
#: averages, on 2.8; 2.7 rejects it). So grads come out ``shard size`` times too large on
#: CPU. Cells judged under a quirk say so in their record (``reference_quirks``).
GLOO_AVG_SUMS = "gloo reduce-scatter AVG sums (torch < 2.9): reference averages over the replicate dim only"


def quirks_for(*, torch_version: str, backend: str) -> list[str]:
    """The backend quirks that apply to a cell (see ``GLOO_AVG_SUMS``)."""
    from packaging.version import Version

    if "gloo" in backend and "nccl" not in backend and torch_release(torch_version) < Version("2.9"):
        return [GLOO_AVG_SUMS]
    return []


def run_reference(scenario: Scenario, world_size: int, *, quirks: list[str] | None = None) -> list[StepSnapshot]:
    """Replay ``scenario`` at ``world_size`` ranks (its data-parallel ones) in this process."""
    torch.manual_seed(scenario.seed)
    model = scenario.model()
    named = dict(model.named_parameters())
    side = ReferenceSide(scenario, model, scenario.sharding.data_parallel(world_size), quirks or [])
    return recipe.train(scenario, side, named)


def _cast_params(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """What FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` computes with: the parameters
    cast, the buffers (rotary frequencies, ...) left as they are."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)
    return model


class ReferenceSide:
    """The recipe's ``Side`` in one process: every rank replayed, grads averaged by hand."""

    def __init__(self, scenario: Scenario, model: nn.Module, world_size: int, quirks: list[str]) -> None:
        self.scenario, self.model, self.world_size = scenario, model, world_size
        self.named = dict(model.named_parameters())
        self.divisor = world_size
        if GLOO_AVG_SUMS in quirks:  # gloo summed over the shard group; only HSDP's replicate dim averaged
            self.divisor = scenario.sharding.replicate

    def micro_batch(self, step: int, k: int, micro_batch: MicroBatch) -> None:
        for name, g in self._mean_over_ranks(step, k).items():
            p = self.named[name]
            p.grad = g.to(p.dtype) if p.grad is None else p.grad + g.to(p.dtype)

    def _mean_over_ranks(self, step: int, k: int) -> dict[str, torch.Tensor]:
        """Mean over ranks of each parameter's gradient for micro-batch ``k`` (only used ones)."""
        s = self.scenario
        compute_dtype = s.sharding.param_dtype
        reduce_dtype = s.sharding.reduce_dtype or compute_dtype or torch.float32
        total: dict[str, torch.Tensor] = {}
        for rank in range(self.world_size):
            ctx = Ctx(rank=rank, world_size=self.world_size, step=step, micro_batch=k)
            torch.manual_seed(s.batch_seed(ctx))
            batch = s.batch(ctx)
            replica = self.model
            if compute_dtype is not None:
                replica = _cast_params(copy.deepcopy(self.model), compute_dtype)
                batch = move_batch(batch, float_dtype=compute_dtype)
            trainable = [(n, p) for n, p in replica.named_parameters() if p.requires_grad]
            loss = s.forward(replica, batch, ctx)
            grads = torch.autograd.grad(loss, [p for _, p in trainable], allow_unused=True)
            for (name, _), g in zip(trainable, grads):
                if g is not None:
                    g = g.to(reduce_dtype)
                    total[name] = g if name not in total else total[name] + g
        return {name: g / self.divisor for name, g in total.items()}

    def scale(self, factor: float) -> None:
        for p in self.named.values():
            if p.grad is not None:
                p.grad.mul_(factor)

    def grads(self) -> tuple[dict[str, torch.Tensor | None], dict[str, list[int]]]:
        return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in self.named.items()}, {}

    def clip(self, clip: Clip) -> float:
        with_grad = [p for p in self.named.values() if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(with_grad, clip.max_norm, clip.norm_type, foreach=False))

    def params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.named.items()}

    def flush(self) -> None:
        """Nothing to complete: every snapshot is already a private copy."""
