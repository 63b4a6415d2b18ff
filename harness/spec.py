"""The scenario API: what a file in ``scenarios/`` declares.

A scenario is data plus three small functions (model, batch, forward). The worker
(``harness.worker``) runs it under FSDP2 and the reference (``harness.reference``)
replays it in one process; both read only what is declared here, so a scenario
never touches torch.distributed itself.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from torch import nn

__all__ = [
    "Clip",
    "Ctx",
    "Expect",
    "MicroBatch",
    "Optim",
    "Scenario",
    "Sharding",
    "STATUSES",
    "accumulate",
    "default_forward",
    "import_file",
    "torch_release",
]

#: Every status a cell can end with.
STATUSES = ("pass", "mismatch", "error", "hang", "crash", "skip")
DEVICES = ("cpu", "cuda")
VARIANTS = ("vanilla", "patched")


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
class Sharding:
    """How ``fully_shard`` is applied.

    ``units`` are sub-module names that get their own ``fully_shard`` (in this order,
    before the root). ``replicate`` > 1 makes an HSDP mesh ``(replicate, world // replicate)``
    with dims ("replicate", "shard"); 1 gives a 1-D FSDP mesh.
    ``reduce_scatter_unused_params`` is the user's opt-in to the public API of that name
    (torch >= 2.13); where the API is absent a vanilla cell is skipped.
    """

    units: tuple[str, ...] = ()
    replicate: int = 1
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    offload: bool = False
    reshard_after_forward: bool = True
    reduce_scatter_unused_params: bool = False

    def mesh_shape(self, world_size: int) -> tuple[int, ...]:
        if self.replicate == 1:
            return (world_size,)
        if world_size % self.replicate:
            raise ValueError(f"world size {world_size} is not divisible by replicate={self.replicate}")
        return (self.replicate, world_size // self.replicate)


@dataclass(kw_only=True, frozen=True)
class Optim:
    """AdamW settings (the optimizer every scenario uses)."""

    lr: float = 1e-2
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def build(self, params) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)


@dataclass(kw_only=True, frozen=True)
class Clip:
    """Gradient clipping after accumulation (``clip_grad_norm_``)."""

    max_norm: float = 0.05
    norm_type: float = 2.0
    foreach: bool | None = None


@dataclass(kw_only=True, frozen=True)
class Expect:
    """An expected outcome for cells matching ``torch``/``variant``/``devices``/``world_sizes``.

    ``status`` may name alternatives with ``|`` ("hang|crash|error"). ``match`` is text
    the first error line (or the traceback) must contain.
    """

    status: str
    torch: str = ""
    variant: Literal["vanilla", "patched"] = "vanilla"
    match: str | None = None
    devices: tuple[str, ...] = DEVICES
    world_sizes: tuple[int, ...] | None = None
    why: str = ""

    def __post_init__(self) -> None:
        for s in self.status.split("|"):
            if s not in STATUSES:
                raise ValueError(f"Expect.status: unknown status {s!r} (choose from {', '.join(STATUSES)})")
        try:
            SpecifierSet(self.torch)
        except InvalidSpecifier as e:
            raise ValueError(f"Expect.torch: bad version range {self.torch!r}") from e

    def applies(self, *, variant: str, torch_version: str, device: str, world_size: int) -> bool:
        return (
            variant == self.variant
            and device in self.devices
            and (self.world_sizes is None or world_size in self.world_sizes)
            and torch_release(torch_version) in SpecifierSet(self.torch)
        )


def torch_release(version: str) -> Version:
    """``2.13.0+cpu`` -> ``Version('2.13.0')`` (local labels and pre-release tags dropped)."""
    return Version(Version(version).base_version)


def import_file(path, name: str):
    """Import a ``.py`` file as module ``name`` (cached in ``sys.modules``); a failing
    import leaves no half-initialized module behind."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def default_forward(model: nn.Module, batch: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    """Mean squared output, reduced in fp32."""
    return model(batch).float().square().mean()


@dataclass(kw_only=True)
class Scenario:
    """One FSDP2 training recipe, run by FSDP2 and by the single-process reference.

    ``model()`` and ``batch(ctx)`` are called after the harness seeds torch's RNG (from
    ``seed``, and for batches also from rank, step and micro-batch), so they may simply
    call ``torch.randn``. ``forward(model, batch, ctx)`` returns the loss and may depend
    on rank and micro-batch ("rank 1 skips a layer").
    """

    name: str
    summary: str
    model: Callable[[], nn.Module]
    batch: Callable[[Ctx], torch.Tensor]
    forward: Callable[[nn.Module, torch.Tensor, Ctx], torch.Tensor] = default_forward
    sharding: Sharding = field(default_factory=Sharding)
    schedule: tuple[MicroBatch, ...] = (MicroBatch(),)
    steps: int = 2
    optimizer: Optim = field(default_factory=Optim)
    clip: Clip | None = None
    grad_scale: float | None = None
    #: What the reference gives a parameter no rank used in a window: ``"none"`` (plain
    #: autograd) or ``"zero"`` (the documented result of reducing unused parameters).
    unused_grads: Literal["none", "zero"] = "none"
    #: Re-home sharded grads onto a group with only this backend before norm/clip, per
    #: device (``{"cpu": "cuda:gloo"}`` simulates an NCCL-only group on CPU).
    norm_group_backend: dict[str, str] = field(default_factory=dict)
    #: Process-group backend per device when it is not the default.
    backend: dict[str, str] = field(default_factory=dict)
    world_sizes: tuple[int, ...] = (1, 2, 4)
    devices: tuple[str, ...] = DEVICES
    patches: tuple[str, ...] = ()
    #: devices on which the bug can show at all; elsewhere the cell checks numbers only
    #: and a pass is "ok", not "fixed upstream"
    bug_devices: tuple[str, ...] = DEVICES
    expect: tuple[Expect, ...] = ()
    #: per-cell timeout; ``None`` takes the run's (``--timeout``, matrix.yaml ``timeout_s``, else 30 s)
    timeout_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ValueError(f"scenario name {self.name!r}: use letters, digits and '_'")
        if self.steps < 1 or not self.schedule:
            raise ValueError(f"scenario {self.name}: needs at least one step and one micro-batch")
        if not self.schedule[-1].sync:
            raise ValueError(f"scenario {self.name}: the last micro-batch must sync gradients")
        for d in self.devices:
            if d not in DEVICES:
                raise ValueError(f"scenario {self.name}: unknown device {d!r}")
        for ws in self.world_sizes:
            self.sharding.mesh_shape(ws)
        if self.unused_grads not in ("none", "zero"):
            raise ValueError(f"scenario {self.name}: unused_grads must be 'none' or 'zero'")

    # -- derived facts -------------------------------------------------------------
    def backend_for(self, device: str) -> str:
        return self.backend.get(device, "gloo" if device == "cpu" else "nccl")

    def expected(self, *, variant: str, torch_version: str, device: str, world_size: int) -> Expect:
        """The first matching expectation; otherwise the cell should pass."""
        for e in self.expect:
            if e.applies(variant=variant, torch_version=torch_version, device=device, world_size=world_size):
                return e
        return Expect(status="pass", variant=variant)  # type: ignore[arg-type]

    def batch_seed(self, ctx: Ctx) -> int:
        key = f"{self.name}/{self.seed}/{ctx.rank}/{ctx.step}/{ctx.micro_batch}".encode()
        return zlib.crc32(key)

    def replace(self, **changes: object) -> Scenario:
        """A copy with some fields changed (for variants of one recipe)."""
        return dataclasses.replace(self, **changes)
