"""How a scenario applies ``fully_shard``: units, mesh (FSDP, HSDP, or tensor parallel x
FSDP), mixed precision, offload, and the public unused-parameter opt-in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

__all__ = ["Sharding"]


@dataclass(kw_only=True, frozen=True)
class Sharding:
    """How ``fully_shard`` is applied.

    ``units`` are sub-module names that get their own ``fully_shard`` (in this order,
    before the root); ``"a+b"`` shards both as one group (``fully_shard([a, b])``: modules
    that share a tied parameter). ``replicate`` > 1 makes an HSDP mesh ``(replicate, world // replicate)``
    with dims ("replicate", "shard"); ``tp`` > 1 a 2-D mesh ``(world // tp, tp)`` with dims
    ("dp", ``tp_dim``), where ``tp_plan(model, tp_mesh)`` applies tensor parallelism before
    ``fully_shard`` over "dp" (the ranks of one "dp" index see the same data); else a 1-D
    FSDP mesh. ``prepare(model)`` runs on the FSDP side before sharding (activation
    checkpointing, ``torch.compile`` of blocks); it must keep parameter names.
    ``reduce_scatter_unused_params`` is the user's opt-in to the public API of that name
    (torch >= 2.13); where the API is absent a vanilla cell is skipped.
    """

    units: tuple[str, ...] = ()
    replicate: int = 1
    tp: int = 1
    tp_plan: Callable[[nn.Module, object], object] | None = None
    #: the name of the second mesh dim when ``tp`` > 1 (expert-parallel stacks name it "ep",
    #: and their clipping finds expert parameters by that name)
    tp_dim: str = "tp"
    prepare: Callable[[nn.Module], object] | None = None
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    offload: bool = False
    reduce_scatter_unused_params: bool = False
    #: ``MixedPrecisionPolicy`` fields given to ``fully_shard`` as they are, over the two
    #: above (e.g. the 2.15 ``param_dtype_override_fn``, ``cast_forward_inputs``). The reference
    #: emulates only ``param_dtype``/``reduce_dtype`` above, so these must leave every
    #: parameter computing in the dtype the model computes it in itself (bug K's ``api``
    #: variant: storage upcast to fp32, each parameter all-gathered in its model dtype).
    mp_fields: dict[str, object] = field(default_factory=dict)
    #: "full": the model is built on this rank's device under ``MODEL_SEED``, then sharded.
    #: "meta": built on the meta device, sharded, ``to_empty`` on the device, then every
    #: sub-module's ``reset_parameters()`` runs under ``MODEL_SEED`` (how large-model stacks
    #: initialise; the reference still builds the full model, so a sharded init that differs
    #: from a single process's shows in the step-0 grads).
    #: "rank0": built on meta on every rank, sharded, ``to_empty`` on the device (every float
    #: tensor then NaN: uninitialised memory, the same on every machine), then rank 0's
    #: checkpoint (the model built in full under ``MODEL_SEED``) loaded with
    #: ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``: how stacks load
    #: a checkpoint without a full copy on every rank (``harness.train.meta_build.load_from_rank0``).
    init: Literal["full", "meta", "rank0"] = "full"

    def __post_init__(self) -> None:
        if self.tp_dim in ("dp", "replicate", "shard") or not self.tp_dim.isidentifier():
            raise ValueError(f"Sharding.tp_dim {self.tp_dim!r}: a name of its own, e.g. 'tp' or 'ep'")
        if self.init not in ("full", "meta", "rank0"):
            raise ValueError(f"Sharding.init must be 'full', 'meta' or 'rank0', not {self.init!r}")

    def mesh_shape(self, world_size: int) -> tuple[int, ...]:
        split = self.tp if self.tp > 1 else self.replicate
        if self.tp > 1 and self.replicate > 1:
            raise ValueError("Sharding: tensor parallel with HSDP (tp and replicate both > 1) is not supported")
        if split == 1:
            return (world_size,)
        if world_size % split:
            raise ValueError(f"world size {world_size} is not divisible by {'tp' if self.tp > 1 else 'replicate'}"
                             f"={split}")
        return (world_size // self.tp, self.tp) if self.tp > 1 else (self.replicate, world_size // self.replicate)

    def mesh_dim_names(self, world_size: int) -> tuple[str, ...]:
        shape = self.mesh_shape(world_size)
        if len(shape) == 1:
            return ("shard",)
        return ("dp", self.tp_dim) if self.tp > 1 else ("replicate", "shard")

    def data_parallel(self, world_size: int) -> int:
        """How many ranks see different data (tensor-parallel ranks share theirs)."""
        return world_size // self.tp
