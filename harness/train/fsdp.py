"""Train one scenario with FSDP2 on this rank and snapshot what it produced.

Called by ``harness.rank.worker`` with the cell's default process group already initialized;
the step loop is ``harness.train.recipe``'s, this module supplies the FSDP2 ``Side``. Every
rank runs the same collectives in the same order; rank 0 keeps the snapshots. Grad
presence is exchanged first (an object all-gather), so a parameter whose presence
differs across ranks is reported instead of desynchronizing the gather.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp_public
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor

from harness.plan.cells import Cell
from harness.scenario.apis import PublicApi
from harness.scenario.spec import MODEL_SEED, Clip, Ctx, MicroBatch, Scenario, move_batch
from harness.train import ledger as collectives
from harness.train import recipe
from harness.train import resources as held
from harness.train.faults import fault_named
from harness.train.gather import Deferred, gather_full, plain_placements
from harness.train.hooks import Hook, HookPoint
from harness.train.meta_build import checkpoint_on_rank0, init_on, load_from_rank0, materialized_on
from harness.train.norm_group import rehome
from harness.train.probe import Probes, measure_reduction
from harness.train.requested import sharding_problems
from harness.train.step import StepTensors
from harness.undertest.source import Utilities

__all__ = ["FsdpSide", "build_model", "train"]

#: what ``timed(phase)`` gives where no phase clock is passed in
_UNTIMED = contextlib.nullcontext()


def train(scenario: Scenario, cell: Cell, utilities: Utilities | None, rank: int, world: int,
          stamp: Callable[[str], object] = lambda phase: None,
          probes: Probes | None = None, timed: Callable[[str], Any] = lambda phase: _UNTIMED) -> list[StepTensors]:
    """Build, shard and train ``scenario`` on this rank; snapshots of every step.

    ``stamp(phase)`` is told where the rank is ("build model", "step 0 micro-batch 1
    backward", ...), so a hang can be blamed on the rank that did not arrive; ``timed(phase)``
    charges a block of the harness's own work to ``phase`` (``harness.rank.phases``). ``probes``:
    the reduction probe's earlier answers with this patch set, by (backend, shard group,
    dtype); every rank of the group must hold the same, or some would skip its collectives."""
    device = _rank_device(cell.device)
    stamp("build model")
    mesh = init_device_mesh(cell.device, tuple(cell.mesh), mesh_dim_names=scenario.sharding.mesh_dim_names(world))
    _all_connected(device)
    api = scenario.api if cell.variant == "api" else None
    model = build_model(scenario, mesh, cell.device, api=api)
    sums = measure_reduction(scenario, cell, model, mesh, device, probes, stamp)
    side = FsdpSide(scenario, cell, model, mesh, device, utilities, rank=rank, world=world, stamp=stamp, timed=timed)
    measure = side.measure if rank == 0 and held.enabled(scenario.measures("resources")) else None  # rank 0's record
    with collectives.recording() as side.ledger:  # the scenario's collectives only (``harness.train.ledger``)
        observed = recipe.train(scenario, side, side.named, after_step=measure)
    with timed("compare"):  # the harness's checks of what FSDP2 did
        for snap in observed:  # filled when the snapshots were gathered
            snap.diverged = {f"{kind} {name}": gap for step, kind, gaps in side.replicas if step == snap.step
                             for name, gap in gaps.items()}
        if observed:
            observed[0].reduction_sums = sums
            observed[0].ledger = side.ledger.rows() if side.ledger is not None else None
            observed[0].resources = side.resources or None
            observed[0].sharding = sharding_problems(model, scenario, cell, ledger=observed[0].ledger)
    return observed


def _all_connected(device: torch.device) -> None:
    """Wait until every rank has built every group of the mesh, before any scenario code runs.

    A rank that fails early (a planted or real error in its first forward) shuts its
    sockets at once; a peer still finishing its side of a group's connection then fails
    inside the group's constructor (gloo: "connectFullMesh failed ... Connection closed by
    peer") instead of in the collective the scenario is about."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _rank_device(device_type: str) -> torch.device:
    """This rank's device: its current CUDA device, or the CPU."""
    return torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")


def build_model(scenario: Scenario, mesh: DeviceMesh, device_type: str, api: PublicApi | None = None) -> nn.Module:
    """The scenario's model (seeded like the reference), sharded as it declares; with the
    ``api`` variant's ``configure`` called on every FSDP module, children first.

    ``fully_shard`` is looked up on ``torch.distributed.fsdp`` at call time, as training
    code that calls it through the module does, so a patch that changes how a model is
    sharded (``shard_by_dtype``: a unit per parameter dtype) takes effect."""
    s = scenario.sharding
    where = materialized_on(s, _rank_device(device_type))  # where a meta-built model is materialised
    if s.init == "rank0":
        checkpoint = checkpoint_on_rank0(scenario, where, dist.get_rank())
    torch.manual_seed(MODEL_SEED)
    with torch.device("meta") if s.init in ("meta", "rank0") else contextlib.nullcontext():
        model = scenario.model()
    dp_world = s.data_parallel(mesh.size())
    if s.prepare is not None:
        s.prepare(model)
    if s.tp > 1:
        assert s.tp_plan is not None, f"{scenario.name}: Sharding.tp needs a tp_plan"
        s.tp_plan(model, mesh[s.tp_dim])
        mesh = mesh["dp"]
    kwargs: dict[str, Any] = {"mesh": mesh}
    if s.param_dtype is not None or s.reduce_dtype is not None or s.mp_fields:
        fields = {"param_dtype": s.param_dtype, "reduce_dtype": s.reduce_dtype, **s.mp_fields}
        kwargs["mp_policy"] = MixedPrecisionPolicy(**fields)  # type: ignore[arg-type]
    # pinned host memory needs an accelerator; on CPU the grads stay unpinned
    kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type != "cpu") if s.offload else OffloadPolicy()
    for unit in s.units:  # "a+b": one group over both (tied parameters)
        modules = [model.get_submodule(fqn) for fqn in unit.split("+")]
        fsdp_public.fully_shard(modules if len(modules) > 1 else modules[0], **kwargs)
    fsdp_public.fully_shard(model, **kwargs)
    if s.init == "meta":
        init_on(model, where)
    elif s.init == "rank0":
        load_from_rank0(model, checkpoint, where)
    if s.reduce_scatter_unused_params:
        for module in model.modules():  # the setter does not reach child FSDP modules
            if hasattr(module, "set_reduce_scatter_unused_params"):
                module.set_reduce_scatter_unused_params(True)
    if api is not None and api.configure is not None:
        fsdp_modules = [m for m in model.modules() if isinstance(m, fsdp_public.FSDPModule)]
        for module in reversed(fsdp_modules):  # children first, the root last
            api.configure(module, dp_world)
    if api is not None and api.configure_root is not None:
        api.configure_root(model, dp_world)
    return model


class FsdpSide:
    """The recipe's ``Side`` under FSDP2: this rank's forward, gathered full tensors."""

    def __init__(self, scenario: Scenario, cell: Cell, model: nn.Module, mesh: DeviceMesh, device: torch.device,
                 utilities: Utilities | None, *, rank: int, world: int,
                 stamp: Callable[[str], object] = lambda phase: None,
                 timed: Callable[[str], Any] = lambda phase: _UNTIMED) -> None:
        self.scenario, self.cell, self.model, self.mesh, self.device = scenario, cell, model, mesh, device
        self.utilities, self.rank, self.world, self.stamp, self.timed = utilities or Utilities(), rank, world, stamp, timed
        self.named = dict(model.named_parameters())
        #: each rank's pieces are blocks of the full tensors (``Deferred.admit``): snapshots are captured
        #: now and gathered together in ``flush``; else (None) each snapshot is gathered at once
        deferred, params = Deferred(rank=rank, world=world), list(self.named.values())
        fast = plain_placements(params)
        if not fast:  # ``admit`` is collective: only where some layout is not plain
            with timed("gather"):
                fast = deferred.admit(params)
        self.deferred = deferred if fast else None
        self.step = 0
        #: the data-parallel coordinates (tensor-parallel ranks of one dp index share their data)
        self.dp_rank, self.dp_world = rank // scenario.sharding.tp, scenario.sharding.data_parallel(world)
        #: counts the scenario's collectives while ``train`` records; paused around the harness's own
        self.ledger: collectives.Ledger | None = None
        #: what this rank held after each optimizer step (``harness.train.resources``: rows)
        self.resources: list[list[int | None]] = []
        #: a fault to inject (``run --fault``)
        self.fault = fault_named(cell.fault)
        #: (step, snapshot kind, name -> how far HSDP's replicas of it differ): ``harness.train.gather``
        self.replicas: list[tuple[int, str, dict[str, float]]] = []
        self._grad_snapshots = 0

    def measure(self, step: int, snapshots: list[StepTensors]) -> None:
        """Live tensors after the optimizer step, less the harness's own snapshot copies."""
        exclude = (snapshots, self.deferred.pending if self.deferred is not None else None)
        with self.timed("compare"):
            self.resources.append(held.measure(step, device=self.device, exclude=exclude).row())

    def _at(self, phase: str | None, micro_batch: int | None = None) -> None:
        if self.ledger is not None:
            self.ledger.at(phase, step=self.step, micro_batch=micro_batch)

    def begin_step(self, step: int) -> None:
        """Each of the scenario's hooks' ``begin_step``, its collectives under its ledger phase."""
        self.step, self._grad_snapshots = step, 0
        self._hooks("begin_step", "start of step")

    def _hooks(self, point: str, words: str) -> None:
        at = HookPoint(root=self.model, step=self.step, utilities=self.utilities,
                       api=self.scenario.api if self.cell.variant == "api" else None)
        for hook in self.scenario.hooks:
            if getattr(type(hook), point) is getattr(Hook, point):
                continue  # the hook does nothing here
            self.stamp(f"step {self.step} {words}: {hook.phase}")
            self._at(hook.phase)
            getattr(hook, point)(at)
            self._at(None)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, snap: StepTensors) -> None:
        optimizer.step()

    def micro_batch(self, step: int, k: int, micro_batch: MicroBatch) -> None:
        self.step = step
        self.model.set_requires_gradient_sync(micro_batch.sync)
        if self.scenario.sharding.replicate > 1:
            self.model.set_requires_all_reduce(micro_batch.all_reduce)
        ctx = Ctx(rank=self.dp_rank, world_size=self.dp_world, step=step, micro_batch=k)
        recipe.seed_batch(self.scenario.batch_seed(ctx), self.device)
        batch = move_batch(self.scenario.batch(ctx), self.device)
        self.stamp(f"step {step} micro-batch {k} forward")
        self._at("forward", k)
        loss = self.scenario.forward(self.model, batch, ctx)
        if self.fault is not None and self.fault.loss_factor is not None and step == 0:
            loss = loss * self.fault.loss_factor(self.dp_rank, self.dp_world, k)
        self.stamp(f"step {step} micro-batch {k} backward")
        self._at("backward", k)
        loss.backward()
        self._at(None)

    def end_window(self) -> None:
        """Each of the scenario's hooks (``harness.train.hooks``), its collectives under its
        ledger phase; then a grad fault (step 0)."""
        self._hooks("end_window", "end of window")
        if self.fault is not None and self.fault.grads is not None and self.step == 0:
            self._at(None)  # the fault's collective is not the scenario's
            grads = {n: p.grad for n, p in self.named.items() if p.grad is not None}
            self.fault.grads({n: g.to_local() if isinstance(g, DTensor) else g for n, g in grads.items()},
                             self.rank, self.device)

    def scale(self, factor: float) -> None:
        """A 0-dim scaler on the compute device, as training loops write it; nothing where
        the ``api`` variant's divide factor already scaled the grads in the reduction."""
        if self.cell.variant == "api" and self.scenario.api is not None and self.scenario.api.scales_grads:
            return
        self._at("scale")
        scaler = torch.tensor(factor, device=self.device)
        params = list(self.named.values())
        util = self.utilities.scale_grads
        if util is not None:
            util(params, scaler)
            return
        for p in params:
            if p.grad is not None:
                p.grad *= scaler

    def grads(self) -> tuple[dict[str, torch.Tensor | None], dict[str, list[int]]]:
        """Full grads on rank 0, and the names whose grad presence differed across ranks."""
        self._grad_snapshots += 1  # the recipe's second of a step is after clipping
        return self._snapshot({n: p.grad for n, p in self.named.items()}, "grads",
                              "grad" if self._grad_snapshots == 1 else "clipped")

    def clip(self, clip: Clip) -> float:
        self.stamp(f"step {self.step} clip")
        self._at("clip")
        params = [p for p in self.named.values() if p.grad is not None]
        backend = self.scenario.groups.norm_backend.get(self.cell.device)
        restore = rehome(params, backend) if backend else None
        try:
            fn = self.utilities.clip_grad_norm or torch.nn.utils.clip_grad_norm_
            total = fn(params, clip.max_norm, clip.norm_type)
        finally:
            if restore is not None:
                restore()
        if isinstance(total, DTensor):
            total = total.full_tensor()
        return float(total)

    def params(self) -> dict[str, torch.Tensor]:
        full, _ = self._snapshot({n: p.detach() for n, p in self.named.items()}, "params", "param")
        return full  # type: ignore[return-value]

    def flush(self) -> None:
        """Gather every snapshot captured so far (one collective); rank 0's dicts fill in."""
        self._at(None)
        if self.deferred is not None:
            with self.timed("gather"):
                self.stamp(f"step {self.step} gather snapshots")
                self.deferred.flush()

    def _snapshot(self, tensors: dict[str, torch.Tensor | None], what: str, kind: str):
        self._at(None)  # the harness's gathers are not the scenario's; what follows is the optimizer's
        try:
            with self.timed("gather"):  # the copies too; then back to the phase that ran
                if self.deferred is not None:
                    diverged: dict[str, float] = {}
                    self.replicas.append((self.step, kind, diverged))
                    return self.deferred.capture(tensors, diverged)
                self.stamp(f"step {self.step} gather {what}")
                return gather_full(tensors, rank=self.rank, world=self.world, fast=False)
        finally:
            self._at("optimizer")

