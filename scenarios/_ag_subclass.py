"""A minimal weight subclass with FSDP2's all-gather extension, in both hook forms torch accepts.

FSDP2 all-gathers a parameter whose local shard defines ``fsdp_pre_all_gather`` and
``fsdp_post_all_gather`` through those hooks instead of its own copy-in (the float8
path). It picks the form by ``inspect.signature`` of the bound pre-hook, 2.7 .. 2.15 alike:

* one argument, ``fsdp_pre_all_gather(mesh)``: nothing else is passed and nothing is
  checked, so on an uneven shard the hook must pad to the padded shard itself, from what
  it knows (``OneArgWeight`` records the unsharded row count when it is made);
* five, ``fsdp_pre_all_gather(mesh, outer_size, outer_stride, module, mp_policy)``:
  FSDP2 checks, on the ranks whose shard is short, that every all-gather input has the
  padded sharded size, and leaves the ``param_dtype`` cast to the hook
  (``FiveArgWeight`` pads from ``outer_size`` and casts to ``mp_policy.param_dtype``).

Both send the shard's bits as an integer tensor (lossless) and return a view of the
all-gather output as the unsharded weight, so a later all-gather (``out=``) refills it in
place and there is nothing to copy. ``UnpaddedWeight`` is the one-argument form that
sends the shard as it is (pytorch/ao#3982: fine while shards are even).

The subclass keeps itself through the ops FSDP2 applies to a parameter while sharding it
(chunk, narrow, new_zeros, copy_, view, detach, ...); any other op returns a plain
tensor, so grads and optimizer state are plain. ``prepare_weights`` converts a model's
2-D weights before ``fully_shard`` (``Sharding(prepare=...)``); the reference keeps the
plain model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

__all__ = ["FiveArgWeight", "OneArgWeight", "UnpaddedWeight", "prepare_weights"]

_aten = torch.ops.aten
#: ops whose outputs stay wrapped (views, chunks and the new tensors FSDP2 pads shards with)
_KEEP = {
    _aten.detach, _aten.alias, _aten.view, _aten._unsafe_view, _aten.as_strided, _aten.slice, _aten.split,
    _aten.split_with_sizes, _aten.chunk, _aten.narrow, _aten.new_zeros, _aten.new_empty, _aten.new_empty_strided,
    _aten.empty_like, _aten.clone,
}
#: the bits a dtype is all-gathered as
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


class _Weight(torch.Tensor):
    """A weight held as a plain tensor ``_data``; ``_outer_rows`` is the unsharded row count."""

    _data: torch.Tensor
    _outer_rows: int

    @staticmethod
    def __new__(cls, data: torch.Tensor, outer_rows: int | None = None) -> _Weight:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=data.device, layout=data.layout, requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor, outer_rows: int | None = None) -> None:
        self._data = data
        self._outer_rows = data.shape[0] if outer_rows is None else outer_rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r}, outer_rows={self._outer_rows})"

    def __tensor_flatten__(self) -> tuple[list[str], int]:
        return ["_data"], self._outer_rows

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, torch.Tensor], outer_rows: int, outer_size, outer_stride):
        return cls(inner["_data"], outer_rows)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wrapped: dict[int, _Weight] = {}

        def unwrap(t: _Weight) -> torch.Tensor:
            wrapped[id(t._data)] = t
            return t._data

        out = func(*tree_map_only(_Weight, unwrap, args), **tree_map_only(_Weight, unwrap, kwargs))
        proto = next(iter(wrapped.values()))

        def rewrap(t: torch.Tensor) -> torch.Tensor:
            if id(t) in wrapped:  # an in-place op (copy_, mul_, ...) returns its wrapped argument
                return wrapped[id(t)]
            return type(proto)(t, proto._outer_rows) if func.overloadpacket in _KEEP else t

        return tree_map_only(torch.Tensor, rewrap, out)

    # -- what the hooks share ---------------------------------------------------------
    def _padded(self, rows: int) -> torch.Tensor:
        """The local shard with zero rows appended up to ``rows`` (FSDP2 pads at the end)."""
        data = self._data
        if data.shape[0] == rows:
            return data
        padded = data.new_zeros((rows, *data.shape[1:]))
        padded[: data.shape[0]].copy_(data)
        return padded

    def fsdp_post_all_gather(self, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any,
                             param_dtype: torch.dtype, *, out: torch.Tensor | None = None):
        (bits,) = all_gather_outputs
        if out is not None:  # a later all-gather refilled the storage ``out`` is a view of
            if out.untyped_storage().data_ptr() != bits.untyped_storage().data_ptr():
                raise AssertionError(f"{type(self).__name__}: the unsharded weight is not a view of the all-gather output")
            return None
        return bits.view(metadata), ()


class OneArgWeight(_Weight):
    """The one-argument hook: pads to ``ceil(outer rows / shard ranks)`` rows itself."""

    def fsdp_pre_all_gather(self, mesh):
        rows = -(-self._outer_rows // mesh.size())
        return (self._padded(rows).view(_BITS[self.dtype]),), self.dtype


class UnpaddedWeight(_Weight):
    """The one-argument hook as pytorch/ao#3982 found it: the shard sent as it is."""

    def fsdp_pre_all_gather(self, mesh):
        return (self._data.view(_BITS[self.dtype]),), self.dtype


class FiveArgWeight(_Weight):
    """The five-argument hook: pads from ``outer_size``, casts to ``mp_policy.param_dtype``."""

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        rows = -(-outer_size[0] // mesh.size())
        dtype = mp_policy.param_dtype or self.dtype
        return (self._padded(rows).to(dtype).view(_BITS[dtype]),), dtype


def prepare_weights(kind: type[_Weight]):
    """A ``Sharding.prepare`` hook: every 2-D ``weight`` of the model becomes a ``kind``."""

    def prepare(model: nn.Module) -> None:
        for module in model.modules():
            w = module._parameters.get("weight")
            if w is not None and w.dim() == 2:
                module.weight = nn.Parameter(kind(w.detach().clone()), requires_grad=w.requires_grad)

    return prepare
