"""Bug N: random initialisation of sharded parameters (meta-device init, pytorch/pytorch#180088).

Large models are built on the meta device, sharded with ``fully_shard``, moved with
``to_empty(device=...)`` and only then initialised (``reset_parameters()``). The init then
draws into each parameter's DTensor. Where DTensor has no random-number tracker for the
mesh's device (CPU), every rank draws its local shard from its own generator: all ranks
seeded alike get shards that are copies of the start of one random stream, not slices of
one full tensor, and each rank advances its generator by its shard's size only, so every
later parameter is off too. On CUDA, DTensor's offset-based tracker makes the shards
slices of one stream, which still differs from what a single process draws. Either way the
sharded model is not the model a single process initialises under the same seed
(pytorch/torchtitan#3106; the torchtitan fix initialises through ``to_local()``).

* ``init_full_then_shard(dtensor, init)`` runs ``init`` (an in-place init of a plain
  tensor) on a full tensor of ``dtensor``'s global shape, on every rank from the same
  generator state, and copies this rank's slice into ``dtensor``'s local shard: every rank
  ends with its slice of one full init, and each generator advances as a single process's
  would. No collective.
* ``patch_fsdp_meta_init_full_rng()`` makes ``DTensor.uniform_`` and ``DTensor.normal_``
  (what ``torch.nn.init``'s random inits call) do that for a DTensor sharded on any mesh
  dim; a replicated one draws as before. Costs one full tensor per parameter at init time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._compat import applicable
from ._wrapping import (
    PatchResult,
    active_wrapper_in_chain,
    already_installed,
    installed,
    make_wrapper,
    not_applicable,
    replace_attribute,
)

__all__ = ["init_full_then_shard", "is_sharded", "patch_fsdp_meta_init_full_rng"]

META_INIT_FULL_RNG = "meta_init_full_rng"
#: The in-place random fills ``torch.nn.init`` draws through (``trunc_normal_``,
#: ``kaiming_*``, ``xavier_*``, ``uniform_``, ``normal_``).
_RANDOM_FILLS = ("uniform_", "normal_")


def is_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor with a ``Shard`` placement (``_StridedShard`` too)."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(tensor, DTensor) and any(isinstance(p, Shard) for p in tensor.placements)


def init_full_then_shard(dtensor: Any, init: Callable[[torch.Tensor], object]) -> Any:
    """Fill ``dtensor``'s local shard with its slice of ``init(full)`` (see the module
    docstring); returns ``dtensor``. ``ValueError`` if ``dtensor`` is not a DTensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(dtensor, DTensor):
        raise ValueError(f"init_full_then_shard: expected a DTensor, got {type(dtensor).__name__}")
    local = dtensor._local_tensor
    with torch.no_grad():
        full = torch.empty(dtensor.shape, dtype=dtensor.dtype, device=local.device)
        init(full)
        shape, offset = compute_local_shape_and_global_offset(dtensor.shape, dtensor.device_mesh, dtensor.placements)
        if tuple(shape) != tuple(local.shape):
            raise ValueError(f"init_full_then_shard: local shard {tuple(local.shape)} is not the "
                             f"{tuple(shape)} its placements {dtensor.placements} give")
        index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        local.copy_(full[index])
    return dtensor


def full_draw(fill: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """The patch's behaviour around ``DTensor.uniform_`` / ``normal_`` (``fill``, unbound)."""
    if not is_sharded(self):
        return fill(self, *args, **kwargs)
    return init_full_then_shard(self, lambda full: fill(full, *args, **kwargs))


def patch_fsdp_meta_init_full_rng() -> PatchResult:
    """Make random inits of a sharded DTensor draw the full tensor and keep this rank's
    slice (bug N), so a meta-device-built, sharded model initialises as a single process does.

    Sets ``DTensor.uniform_`` and ``DTensor.normal_`` (inherited from ``torch.Tensor``
    until now). Not applicable where DTensor or the local-shape helper is missing.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(META_INIT_FULL_RNG, reason)
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: F401
    except ImportError as exc:
        return not_applicable(META_INIT_FULL_RNG, f"DTensor helpers not found: {exc}")
    if all(active_wrapper_in_chain(getattr(DTensor, name), META_INIT_FULL_RNG) for name in _RANDOM_FILLS):
        return already_installed(META_INIT_FULL_RNG)
    labels = []
    for name in _RANDOM_FILLS:
        current = getattr(DTensor, name)
        if not active_wrapper_in_chain(current, META_INIT_FULL_RNG):
            labels.append(replace_attribute(DTensor, name, make_wrapper(current, META_INIT_FULL_RNG, full_draw)))
    return installed(META_INIT_FULL_RNG, f"wrapped {', '.join(labels)}")
