"""The single-process reference: what FSDP2 should have produced.

It never initializes torch.distributed. Every data-parallel rank's forward is replayed
on that rank's data; the gradient of a window is the sum over micro-batches of the mean
over ranks, which is what FSDP2's reduce-scatter (and HSDP's all-reduce) compute. The
step loop itself is ``harness.train.recipe``'s, shared with the FSDP2 side.

The contract for unused parameters is plain autograd's, for every scenario: a parameter
that no rank used in an accumulation window has no grad (``None``), so AdamW neither
steps it nor creates state for it. A parameter some rank used gets the mean over ranks,
the others contributing zero.

One step at a time: given what FSDP2 produced (``observed``), each step of the reference
starts from the params FSDP2 ended the previous step with, and its optimizer steps with
the grads FSDP2 stepped with (where both sides have one; the reference keeps its own grads
for the comparison and for ``zero_grad``). So every quantity is judged against what a
single process computes from the same inputs: a grad against the reference's grad at the
same params, a post-step param against the reference optimizer's step from the same
params and grads. Rounding-level differences in the grads are never fed through AdamW,
whose division by each element's running RMS turns them into differences of order the
learning rate where a grad element is near zero (measured: 1.3e-5 after one step on
another CPU's kernels, every grad within 3.3e-7); and a wrong step (a patched optimizer,
a decayed unused weight) shows at the step where it happens. Without ``observed`` the
reference runs its own trajectory.

The device: the cell's (``device``): a cuda cell's reference runs on its rank's GPU, with
the kernels FSDP2 ran with, as a CPU cell's runs on the CPU; the snapshots it returns are
CPU copies. (Measured on an H200, torch 2.11: judged against a CPU reference, fp16 grads
differ by 2 ulps and the q/k grads of a tiny attention layer, noise-sized at 1e-10, by
more than their own size.)

Mixed precision is emulated, not tolerated: each rank's forward and backward run on a
copy of the model whose parameters (not buffers) are cast to ``param_dtype`` (inputs cast
like FSDP2's root pre-forward),
and the per-rank gradients are upcast to ``reduce_dtype`` before they are averaged.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
from torch import nn

from harness.scenario.spec import MODEL_SEED, Clip, Ctx, MicroBatch, Scenario, Sharding, move_batch, torch_release
from harness.train import recipe
from harness.train.meta_build import build_on_meta
from harness.train.step import StepTensors

__all__ = ["GLOO_AVG_FIX", "GLOO_AVG_SUMS", "PER_USE_UPCAST", "REDUCE_NONE_FP32", "ReferenceSide", "gloo_avg_declared",
           "quirks_for", "run_reference"]


#: Known backend behaviour the reference must model to judge anything else on that
#: backend: before torch 2.9 FSDP2 reduce-scatters fp32/bf16 grads with ReduceOp.AVG,
#: which gloo computes as a sum over the shard group (HSDP's replicate all-reduce still
#: averages, on 2.8; 2.7 rejects it). So grads come out ``shard size`` times too large on
#: CPU. Cells judged under a quirk say so in their record (``reference_quirks``).
GLOO_AVG_SUMS = "gloo reduce-scatter AVG sums (torch < 2.9): reference averages over the replicate dim only"
#: From torch 2.15 FSDP2 accumulates unsharded grads through ``param.grad_dtype``: in a
#: micro-batch without gradient sync, a parameter with no unsharded grad yet (the first
#: micro-batch of a window, or the first that uses it) has ``grad_dtype = reduce_dtype``,
#: so autograd upcasts each use's gradient and adds them in ``reduce_dtype``; later
#: micro-batches sum a parameter's uses in ``param_dtype`` first (as before 2.15). Only a
#: parameter used more than once in a forward (tied embeddings) sees the difference.
PER_USE_UPCAST = ("first no-sync micro-batch upcasts each use of a parameter to reduce_dtype (torch >= 2.15): "
                  "the reference accumulates those uses through grad_dtype too")

#: From torch 2.15 ``MixedPrecisionPolicy(reduce_dtype=None)`` under a ``param_dtype`` reduces
#: the grads in fp32 (the parameters' own dtype), no longer in ``param_dtype``
#: (``scenarios/reduce_dtype_none_bf16.py``; the collective ledger shows the dtype).
REDUCE_NONE_FP32 = "reduce_dtype=None reduces in fp32, not param_dtype (torch >= 2.15)"


#: the patch that fixes the gloo AVG sum (scenarios/gloo_avg_reduce_scatter.py); in force, no sum is declared
GLOO_AVG_FIX = "gloo_reduce_scatter_avg"


def gloo_avg_declared(*, torch_version: str, backend: str, fixed: bool = False) -> bool:
    """Whether the gloo AVG sum (``GLOO_AVG_SUMS``) is a known behaviour of this cell: a gloo-only
    group on torch < 2.9, without its fix in force."""
    from packaging.version import Version

    gloo = "gloo" in backend and "nccl" not in backend
    return gloo and not fixed and torch_release(torch_version) < Version("2.9")


def quirks_for(*, torch_version: str, backend: str, sharding: Sharding | None = None,
               reduction_sums: bool | None = None, fixed: bool = False) -> list[str]:
    """The backend and version quirks the reference models for a cell (``GLOO_AVG_SUMS``,
    ``PER_USE_UPCAST``, ``REDUCE_NONE_FP32``).

    The gloo AVG sum only where declared (``gloo_avg_declared``: ``fixed`` says its fix is in
    force) and, where the cell measured it (``reduction_sums``, with its patch set installed:
    ``harness.train.probe.reduction_sums``), only if it really summed; a sum measured anywhere
    else is not modelled (the judge records it as a finding)."""
    from packaging.version import Version

    quirks = []
    if gloo_avg_declared(torch_version=torch_version, backend=backend, fixed=fixed) and reduction_sums is not False:
        quirks.append(GLOO_AVG_SUMS)
    if sharding is not None and _wider_reduce(sharding) and torch_release(torch_version) >= Version("2.15"):
        quirks.append(PER_USE_UPCAST)
    if sharding is not None and sharding.param_dtype is not None and sharding.reduce_dtype is None \
            and "reduce_dtype" not in sharding.mp_fields and torch_release(torch_version) >= Version("2.15"):
        quirks.append(REDUCE_NONE_FP32)
    return quirks


def _wider_reduce(sharding: Sharding) -> bool:
    compute, reduce = sharding.param_dtype, sharding.reduce_dtype
    return compute is not None and reduce is not None and reduce.itemsize > compute.itemsize


def run_reference(scenario: Scenario, world_size: int, *, quirks: list[str] | None = None,
                  observed: list[StepTensors] | None = None,
                  device: torch.device | str = "cpu") -> list[StepTensors]:
    """Replay ``scenario`` at ``world_size`` ranks (its data-parallel ones) in this process,
    one step at a time from what FSDP2 produced (``observed``, see above), else on its own;
    on ``device`` (built like the FSDP2 side's model: on the CPU then moved, or on meta and
    initialised where the sharded run initialises it, ``harness.train.meta_build``)."""
    device = torch.device(device)
    torch.manual_seed(MODEL_SEED)
    model = build_on_meta(scenario, device) if scenario.sharding.init == "meta" else scenario.model().to(device)
    named = dict(model.named_parameters())
    side = ReferenceSide(scenario, model, scenario.sharding.data_parallel(world_size), quirks or [], observed,
                         device=device)
    return recipe.train(scenario, side, named)


def _cast_params(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """What FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` computes with: the parameters
    cast, the buffers (rotary frequencies, ...) left as they are."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)
    return model


def _grads(loss: torch.Tensor, trainable: list[tuple[str, nn.Parameter]], upcast: set[str],
           reduce_dtype: torch.dtype) -> list[torch.Tensor | None]:
    """The gradient of ``loss`` for each parameter; those in ``upcast`` accumulate each of
    their uses in ``reduce_dtype`` (``PER_USE_UPCAST``), the others sum them in their dtype."""
    if not upcast:
        return list(torch.autograd.grad(loss, [p for _, p in trainable], allow_unused=True))
    for name, p in trainable:  # a private replica: its .grad is ours to use
        p.grad = None
        if name in upcast:
            p.grad_dtype = reduce_dtype
    loss.backward()
    return [p.grad for _, p in trainable]


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """A private CPU copy (what the comparison reads, whatever device the reference ran on)."""
    return t.detach().to("cpu", copy=True)


def _usable(observed: torch.Tensor | None, own: torch.Tensor) -> bool:
    """Whether FSDP2's tensor can stand in for the reference's own (same shape, finite: a NaN
    on the FSDP side is the comparison's finding, not the reference's input)."""
    return observed is not None and observed.shape == own.shape and bool(torch.isfinite(observed).all())


class ReferenceSide:
    """The recipe's ``Side`` in one process: every rank replayed, grads averaged by hand."""

    def __init__(self, scenario: Scenario, model: nn.Module, world_size: int, quirks: list[str],
                 observed: list[StepTensors] | None = None, device: torch.device | str = "cpu") -> None:
        self.scenario, self.model, self.world_size, self.observed = scenario, model, world_size, observed
        self.device = torch.device(device)
        self.named = dict(model.named_parameters())
        self.divisor = world_size
        if GLOO_AVG_SUMS in quirks:  # gloo summed over the shard group; only HSDP's replicate dim averaged
            self.divisor = scenario.sharding.replicate
        self.per_use_upcast = PER_USE_UPCAST in quirks
        self.reduce_none_fp32 = REDUCE_NONE_FP32 in quirks
        #: per rank, the params with an unsharded grad in the current accumulation window
        self.window: list[set[str]] = [set() for _ in range(world_size)]
        self.step = 0

    def begin_step(self, step: int) -> None:
        """From step 1 on (with ``observed``): start from the params FSDP2 ended the last step with."""
        self.step = step
        if self.observed is None or step == 0 or step > len(self.observed):
            return
        with torch.no_grad():
            for name, p in self.named.items():
                o = self.observed[step - 1].params.get(name)
                if _usable(o, p):
                    p.copy_(o)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, snap: StepTensors) -> None:
        """Step with FSDP2's grads where both sides have one (``observed``); note each update's size."""
        own = {name: p.grad for name, p in self.named.items()}
        if self.observed is not None and snap.step < len(self.observed):
            theirs = self.observed[snap.step]
            self._take_grads(theirs.clipped if self.scenario.clip is not None else theirs.grads)
        before = {name: p.detach().clone() for name, p in self.named.items()}
        optimizer.step()
        for name, p in self.named.items():
            p.grad = own[name]
            change = (p.detach() - before[name]).abs()
            snap.update[name] = float(change.max()) if change.numel() else 0.0

    def _take_grads(self, theirs: dict[str, torch.Tensor | None]) -> None:
        """FSDP2's grads (private copies, in the reference's device and dtype) in place of the
        reference's own, where both sides have one."""
        for name, p in self.named.items():
            o = theirs.get(name)
            if p.grad is not None and _usable(o, p):
                p.grad = o.to(p.grad.device, p.grad.dtype).clone()

    def micro_batch(self, step: int, k: int, micro_batch: MicroBatch) -> None:
        for name, g in self._mean_over_ranks(step, k, micro_batch.sync).items():
            p = self.named[name]
            dtype = getattr(p, "grad_dtype", None) or p.dtype  # torch >= 2.10: grads kept in the asked dtype
            p.grad = g.to(dtype) if p.grad is None else p.grad + g.to(dtype)

    def _mean_over_ranks(self, step: int, k: int, sync: bool) -> dict[str, torch.Tensor]:
        """Mean over ranks of each parameter's gradient for micro-batch ``k`` (only used ones)."""
        s = self.scenario
        compute_dtype = s.sharding.param_dtype
        reduce_dtype = s.sharding.reduce_dtype or (None if self.reduce_none_fp32 else compute_dtype) or torch.float32
        total: dict[str, torch.Tensor] = {}
        for rank in range(self.world_size):
            ctx = Ctx(rank=rank, world_size=self.world_size, step=step, micro_batch=k)
            recipe.seed_batch(s.batch_seed(ctx), self.device)
            batch = move_batch(s.batch(ctx), self.device)
            replica = self.model
            if compute_dtype is not None:
                replica = _cast_params(copy.deepcopy(self.model), compute_dtype)
                batch = move_batch(batch, float_dtype=compute_dtype)
            loss = s.forward(replica, batch, ctx)
            trainable = [(n, p) for n, p in replica.named_parameters() if p.requires_grad]
            upcast = {n for n, _ in trainable if n not in self.window[rank]} if self.per_use_upcast and not sync else set()
            grads = _grads(loss, trainable, upcast, reduce_dtype)
            self.window[rank] = set() if sync else self.window[rank] | {n for (n, _), g in zip(trainable, grads) if g is not None}
            for (name, _), g in zip(trainable, grads):
                if g is not None:
                    g = g.to(reduce_dtype)
                    total[name] = g if name not in total else total[name] + g
        return {name: g / self.divisor for name, g in total.items()}

    def end_window(self) -> None:
        """Nothing to reduce: the micro-batches already averaged over the ranks."""

    def scale(self, factor: float) -> None:
        for p in self.named.values():
            if p.grad is not None:
                p.grad.mul_(factor)

    def grads(self) -> tuple[dict[str, torch.Tensor | None], dict[str, list[int]]]:
        return {n: (None if p.grad is None else _cpu_copy(p.grad)) for n, p in self.named.items()}, {}

    def clip(self, clip: Clip) -> float:
        """torch's ``clip_grad_norm_`` (the total norm, then every grad scaled by
        ``max_norm / (norm + 1e-6)`` in the norm's dtype, at most 1); for bf16/fp16 grads and a
        finite norm, the norm accumulated in fp32 and rounded once to the grads' dtype (torch
        rounds every parameter's norm to it). Returns the norm.

        With ``observed`` the clip is judged as one operation, as the params judge the optimizer
        step alone: it clips the grads FSDP2 clipped (where both sides have one; the grads were
        judged before it), and scales them by the norm FSDP2's clip returned, which the norm
        check judges on its own. Measured on an H200 (torch 2.11): bf16 grads of the same GEMMs
        differ by up to one unit in the last place between FSDP2's all-gathered weights and
        the reference's, and torch's 2-norm of bf16 grads by one ulp from one accumulated in
        fp32 (0.0957 vs 0.0962): a clip of each side's own grads by its own norm differed by 2
        units."""
        used: float | None = None
        if self.observed is not None and self.step < len(self.observed):
            theirs = self.observed[self.step]
            self._take_grads(theirs.grads)
            if theirs.grad_norm is not None and math.isfinite(theirs.grad_norm):
                used = theirs.grad_norm
        with_grad = [p for p in self.named.values() if p.grad is not None]
        grads = [p.grad for p in with_grad]
        if math.isinf(clip.norm_type) or not any(g.dtype in (torch.bfloat16, torch.float16) for g in grads):
            total = torch.nn.utils.get_total_norm(grads, clip.norm_type, foreach=False)
        else:
            per_param = torch.stack([torch.linalg.vector_norm(g.float(), clip.norm_type) for g in grads])
            total = torch.linalg.vector_norm(per_param, clip.norm_type).to(
                functools.reduce(torch.promote_types, [g.dtype for g in grads]))
        scale_by = total if used is None else torch.tensor(used, dtype=total.dtype, device=total.device)
        torch.nn.utils.clip_grads_with_norm_(with_grad, clip.max_norm, scale_by, foreach=False)
        return float(total)

    def params(self) -> dict[str, torch.Tensor]:
        return {n: _cpu_copy(p) for n, p in self.named.items()}

    def flush(self) -> None:
        """Nothing to complete: every snapshot is already a private copy."""
