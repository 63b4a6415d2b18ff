"""Bug R: ``aten.alias.default`` has no DTensor sharding strategy (torch 2.9).

pytorch/pytorch#170427. Slicing a sharded DTensor over its whole extent (``dt[:, :n]`` of a
``Shard(1)`` DTensor whose dim 1 has size n: HF's ``logits_to_keep`` slice of sequence-sharded
hidden states) returns an alias, and 2.9.0 and 2.9.1 raise "Operator aten.alias.default does
not have a sharding strategy registered." Earlier releases and 2.10+ have one.

``patch_alias_sharding_strategy`` registers a strategy where none is: the output
takes the input's placements (an alias is the same data). Chosen by feature detection:
"not-applicable" where torch has a strategy, or where its propagator has no strategy table.
Undo takes the entry out again and forgets cached sharding decisions.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _wrapping
from ._wrapping import PatchResult, installed, not_applicable

__all__ = ["patch_alias_sharding_strategy"]

ALIAS_SHARDING_STRATEGY = "alias_sharding_strategy"


def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _has_strategy(prop: Any, op: Any) -> bool:
    tables = ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules")
    return any(op in getattr(prop, name, {}) for name in tables)


def _clear_cache(prop: Any) -> None:
    cached = getattr(prop, "propagate_op_sharding", None)
    for clear in (getattr(cached, "cache_clear", None), getattr(getattr(cached, "cache", None), "cache_clear", None)):
        if clear is not None:
            clear()
            return


class _Entry:
    """The strategy entry this patch added: enough to take it out (``_wrapping.undo_patch``)."""

    def __init__(self, table: dict[Any, Any], op: Any, prop: Any) -> None:
        self.patch, self.table, self.op, self.prop = ALIAS_SHARDING_STRATEGY, table, op, prop

    def undo(self) -> str:
        self.table.pop(self.op, None)
        _clear_cache(self.prop)
        return "op_strategy_funcs[aten.alias.default]: removed"


def patch_alias_sharding_strategy() -> PatchResult:
    """Give ``aten.alias.default`` the strategy of an op that keeps its input's placements."""
    name = ALIAS_SHARDING_STRATEGY
    try:
        prop = _propagator()
        from torch.distributed.tensor._ops._tensor_ops import propagate_single_input_strategy
    except (ImportError, AttributeError) as e:
        return not_applicable(name, f"no DTensor strategy registry to extend ({type(e).__name__}: {e})")
    op = torch.ops.aten.alias.default
    if _has_strategy(prop, op):
        return not_applicable(name, "torch has a sharding strategy for aten.alias.default")
    table = getattr(prop, "op_strategy_funcs", None)
    if not isinstance(table, dict):
        return not_applicable(name, "the sharding propagator has no op_strategy_funcs table")
    prop.register_op_strategy(op, propagate_single_input_strategy)
    _clear_cache(prop)
    _wrapping._SLOTS.append(_Entry(table, op, prop))  # type: ignore[arg-type]
    return installed(name, "registered a sharding strategy for aten.alias.default (its input's placements)")
