"""The scenario API: what a file in ``scenarios/`` declares.

A scenario is data plus three small functions (model, batch, forward). The FSDP2 side
(``harness.train.fsdp``) and the single-process reference (``harness.train.reference``) both
run it through one recipe (``harness.train.recipe``), so a scenario never touches
torch.distributed itself. ``name`` defaults to the file's name and ``summary`` to the
first line of the file's docstring.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.scenario.apis import UNUSED_PARAMS_API, PublicApi
from harness.scenario.expect import GLOO_ABORT, HANG, PASS, Expect, torch_release
from harness.scenario.sharding import Sharding
from harness.scenario.symptoms import differs_only, from_step, grads_scaled, presence_lost
from harness.vocabulary import DEFAULT_WORLD_SIZES, DEVICES, Device

__all__ = [
    "GLOO_ABORT",
    "HANG",
    "Clip",
    "Ctx",
    "Expect",
    "Groups",
    "MicroBatch",
    "MODEL_SEED",
    "Optim",
    "PublicApi",
    "Scenario",
    "Sharding",
    "accumulate",
    "differs_only",
    "from_step",
    "grads_scaled",
    "presence_lost",
    "default_forward",
    "mean_square",
    "move_batch",
    "torch_release",
    "UNUSED_PARAMS_API",
]


@dataclass(kw_only=True, frozen=True)
class Ctx:
    """Where a forward runs: which data-parallel rank, step and micro-batch."""

    rank: int
    world_size: int
    step: int
    micro_batch: int


@dataclass(kw_only=True, frozen=True)
class MicroBatch:
    """One micro-batch of an accumulation window.

    ``sync`` is ``set_requires_gradient_sync`` (reduce-scatter and all-reduce);
    ``all_reduce`` is ``set_requires_all_reduce`` (HSDP's replicate all-reduce only).
    """

    sync: bool = True
    all_reduce: bool = True


def accumulate(n: int, *, last_sync: bool = True) -> tuple[MicroBatch, ...]:
    """``n`` micro-batches without gradient sync, the last one with it."""
    assert n >= 1
    return tuple(MicroBatch(sync=(i == n - 1 and last_sync)) for i in range(n))


@dataclass(kw_only=True, frozen=True)
class Optim:
    """The optimizer: AdamW by default; ``kind="sgd"`` (with momentum, so it keeps state)
    where AdamW's division by ``sqrt(v) + eps`` would blow rounding noise in near-zero
    grads (symmetric batches) up into visible parameter differences."""

    kind: str = "adamw"
    lr: float = 1e-2
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    #: the optimizer's ``foreach`` / ``fused`` implementation choice (None: torch's default)
    foreach: bool | None = None
    fused: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("adamw", "sgd"):
            raise ValueError(f"Optim.kind: {self.kind!r} is not 'adamw' or 'sgd'")
        if self.foreach and self.fused:
            raise ValueError("Optim: foreach and fused cannot both be True")

    def build(self, params) -> torch.optim.Optimizer:
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.betas[0], weight_decay=self.weight_decay,
                                   foreach=self.foreach, fused=self.fused)
        assert self.kind == "adamw", self.kind
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                 foreach=self.foreach, fused=self.fused)


@dataclass(kw_only=True, frozen=True)
class Clip:
    """Gradient clipping after accumulation (``clip_grad_norm_``)."""

    max_norm: float = 0.05
    norm_type: float = 2.0


@dataclass(kw_only=True, frozen=True)
class Groups:
    """Process-group plumbing, per device, where a scenario needs more than the default
    (gloo on CPU, NCCL on CUDA).

    ``backend`` is the cell's group backend (``{"cuda": "cpu:gloo,cuda:nccl"}``);
    ``norm_backend`` re-homes the sharded grads onto a group with only this backend before
    norm/clip (``{"cpu": "cuda:gloo"}`` simulates an NCCL-only group on CPU).
    """

    backend: dict[str, str] = field(default_factory=dict)
    norm_backend: dict[str, str] = field(default_factory=dict)


#: The seed torch's RNG gets before ``Scenario.model()`` (FSDP2 side and reference alike).
MODEL_SEED = 0

def move_batch(batch: Any, device: torch.device | str | None = None, float_dtype: torch.dtype | None = None) -> Any:
    """A batch (a tensor, or a dict / tuple / list of them) on ``device``, floating
    tensors cast to ``float_dtype`` (what FSDP2's mixed precision does to the root's inputs)."""
    if isinstance(batch, torch.Tensor):
        if float_dtype is not None and batch.is_floating_point():
            batch = batch.to(float_dtype)
        return batch.to(device) if device is not None else batch
    if isinstance(batch, dict):
        return {k: move_batch(v, device, float_dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_batch(v, device, float_dtype) for v in batch)
    return batch


def mean_square(output: torch.Tensor) -> torch.Tensor:
    """The loss most scenarios use: the mean squared output, reduced in fp32."""
    return output.float().square().mean()


def default_forward(model: nn.Module, batch: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    """``mean_square(model(batch))``."""
    return mean_square(model(batch))


@dataclass(kw_only=True)
class Scenario:
    """One FSDP2 training recipe, run by FSDP2 and by the single-process reference.

    ``model()`` and ``batch(ctx)`` are called after the harness seeds torch's RNG (with
    ``MODEL_SEED``, and for batches from the scenario's name, rank, step and micro-batch),
    so they may simply call ``torch.randn``. ``forward(model, batch, ctx)`` returns the loss and may depend
    on rank and micro-batch ("rank 1 skips a layer").
    """

    model: Callable[[], nn.Module]
    batch: Callable[[Ctx], torch.Tensor]
    #: defaults to the scenario file's name (set by ``harness.scenario.load``)
    name: str = ""
    #: defaults to the first line of the scenario file's docstring
    summary: str = ""
    forward: Callable[[nn.Module, torch.Tensor, Ctx], torch.Tensor] = default_forward
    sharding: Sharding = field(default_factory=Sharding)
    schedule: tuple[MicroBatch, ...] = (MicroBatch(),)
    #: three steps, so ``zero_grad(set_to_none=False)`` runs mid-training (``harness.train.recipe``)
    steps: int = 3
    optimizer: Optim = field(default_factory=Optim)
    clip: Clip | None = None
    grad_scale: float | None = None
    #: the public API that replaces this scenario's patch, where torch has one (``api`` variant)
    api: PublicApi | None = None
    #: whether the reference models known backend quirks (``harness.train.reference``); a scenario
    #: that reports a quirk as the upstream bug it is sets this False
    reference_quirks: bool = True
    groups: Groups = field(default_factory=Groups)
    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
    devices: tuple[Device, ...] = DEVICES
    #: patch names the patched variant installs (see README "The patches module under test")
    patches: tuple[str, ...] = ()
    #: devices on which the bug can show at all; elsewhere the cell checks numbers only
    #: and a pass is "ok", not "fixed upstream"
    bug_devices: tuple[Device, ...] = DEVICES
    expect: tuple[Expect, ...] = ()
    #: per-cell timeout; ``None`` takes the run's (``--timeout``, matrix.yaml ``timeout_s``, else 30 s)
    timeout_s: float | None = None
    #: modules the scenario needs beyond torch, e.g. ("transformers.models.llama.modeling_llama",):
    #: each worker imports them once before its first cell (forked cells inherit them), and
    #: the cells are skipped, with the reason, where their package is missing
    requires: tuple[str, ...] = ()
    #: checks beyond values (``harness.train.checks``: ``LedgerRules(at_most(...))``,
    #: ``ResourceGrowth()``): on a cell whose values match, the first with problems makes it a
    #: mismatch (worst "<kind>: ..."); every cell also runs ``harness.train.checks.ALWAYS``
    checks: tuple[Any, ...] = ()
    #: what the scenario adds to the FSDP2 side's step (``harness.train.hooks``:
    #: ``ReduceAfterWindow()``), called at their points of the recipe; the reference calls none
    hooks: tuple[Any, ...] = ()

    def measures(self, what: str) -> bool:
        """Whether one of its checks needs the FSDP2 side to record ``what`` (``"resources"``)."""
        return any(what in getattr(check, "measures", ()) for check in self.checks)

    def __post_init__(self) -> None:
        where = f"scenario {self.name or '(unnamed)'}"
        if self.name and not self.name.replace("_", "").isalnum():
            raise ValueError(f"scenario name {self.name!r}: use letters, digits and '_'")
        if self.steps < 1 or not self.schedule:
            raise ValueError(f"{where}: needs at least one step and one micro-batch")
        for hook in self.hooks:
            for problem in hook.problems(self):
                raise ValueError(f"{where}: {problem}")
        if not any(hook.reduces_window for hook in self.hooks) and not self.schedule[-1].sync:
            raise ValueError(f"{where}: the last micro-batch must sync gradients "
                             "(or list a hook that reduces after the window: ReduceAfterWindow())")
        for d in (*self.devices, *self.bug_devices):
            if d not in DEVICES:
                raise ValueError(f"{where}: unknown device {d!r}")
        for ws in self.world_sizes:
            self.sharding.mesh_shape(ws)
        for e in self.expect:
            if e.fixed_by is not None and e.fixed_by not in self.patches:
                raise ValueError(f"{where}: Expect.fixed_by={e.fixed_by!r} is not one of its patches {self.patches}")

    # -- derived facts -------------------------------------------------------------
    def backend_for(self, device: str) -> str:
        return self.groups.backend.get(device, "gloo" if device == "cpu" else "nccl")

    def expected(self, *, variant: str, torch_version: str, device: str, world_size: int) -> Expect:
        """The first matching expectation; otherwise the cell should pass."""
        for e in self.expect:
            if e.applies(variant=variant, torch_version=torch_version, device=device, world_size=world_size):
                return e
        return PASS

    def batch_seed(self, ctx: Ctx) -> int:
        key = f"{self.name}/{MODEL_SEED}/{ctx.rank}/{ctx.step}/{ctx.micro_batch}".encode()
        return zlib.crc32(key)

    def with_api(self) -> Scenario:
        """The recipe with its public API turned on (the ``api`` variant): the API's
        ``sharding`` fields set here; its ``configure`` is the FSDP side's to call
        (``harness.train.fsdp``), since the reference has no FSDP modules."""
        if self.api is None:
            raise ValueError(f"scenario {self.name or '(unnamed)'} declares no public API (api=PublicApi(...))")
        changes: dict[str, object] = {"sharding": dataclasses.replace(self.sharding, **self.api.sharding)}
        if self.api.reference_quirks is not None:
            changes["reference_quirks"] = self.api.reference_quirks
        return self.replace(**changes)

    def replace(self, **changes: object) -> Scenario:
        """A copy with some fields changed (for variants of one recipe)."""
        return dataclasses.replace(self, **changes)
