"""Tensor helpers shared by the gradient norm, clipping and scaling functions."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable

import torch
from torch.utils._foreach_utils import _device_has_foreach_support

__all__ = [
    "DTensor",
    "Partial",
    "TensorOrTensors",
    "as_param_list",
    "group_by_device_and_dtype",
    "is_dtensor",
    "is_shard_placement",
    "local_data",
    "use_foreach",
]

if torch.distributed.is_available():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import placement_types as _placement_types
    from torch.distributed.tensor.placement_types import Partial

    _StridedShard = getattr(_placement_types, "_StridedShard", None)
else:  # a torch build without torch.distributed: every grad is a plain tensor
    DTensor = None  # type: ignore[assignment,misc]
    Partial = None  # type: ignore[assignment,misc]
    _StridedShard = None

TensorOrTensors = torch.Tensor | Iterable[torch.Tensor]


def as_param_list(parameters: TensorOrTensors) -> list[torch.Tensor]:
    """``parameters`` as a list; warns, as torch does, about an empty generator."""
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    params = list(parameters)
    if is_generator and not params:
        warnings.warn(
            "`parameters` is an empty generator, no gradient clipping will occur.",
            stacklevel=3,
        )
    return params


def is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def is_shard_placement(placement: object) -> bool:
    """Whether a mesh dim's placement splits the tensor over that dim's ranks (each rank holds
    different elements): ``Shard``, or ``_StridedShard``, which FSDP2 places on its mesh dim
    when it shards a parameter that is already sharded on the same tensor dim by tensor or
    expert parallelism. From torch 2.10 ``_StridedShard`` is no longer a ``Shard`` subclass
    and its ``is_shard()`` is False, so ``is_shard()`` alone misses it."""
    if placement.is_shard():  # type: ignore[attr-defined]
        return True
    return _StridedShard is not None and isinstance(placement, _StridedShard)


def local_data(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's data (the local shard of a DTensor)."""
    if is_dtensor(t):
        # Under no_grad, to_local() returns the DTensor's own local tensor, so in-place
        # ops on it update the DTensor.
        return t.to_local()  # type: ignore[union-attr]
    return t


def use_foreach(foreach: bool | None, device: torch.device) -> bool:
    """Whether to use the ``torch._foreach_*`` kernels on ``device``."""
    supported = _device_has_foreach_support(device)
    if foreach and not supported:
        raise RuntimeError(
            f"foreach=True was passed, but can't use the foreach API on {device.type} tensors"
        )
    return supported if foreach is None else bool(foreach)


def group_by_device_and_dtype(
    tensors: Iterable[torch.Tensor],
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups
