"""Bug M: before torch 2.9, gloo computes FSDP2's ReduceOp.AVG reduce-scatter as a sum.

pytorch/pytorch#162338. On CPU (gloo), torch 2.7 and 2.8 give fp32/bf16 grads
data-parallel-size times too large, silently; 2.7 also rejects the AVG all-reduce of
HSDP. FSDP2 asks the backend for AVG only where it divides nothing itself (fp32/bf16
reduce dtypes, default divide factor); ``_fsdp_collectives._get_gradient_divide_factors``
makes that choice, and ``foreach_reduce`` looks it up by name on every reduction.

``patch_fsdp_gloo_reduce_scatter_avg`` wraps that function: for a CPU reduction on a
group with a gloo backend, FSDP2 reduces with ReduceOp.SUM and divides by itself, which
is what ``FSDPModule.set_force_sum_reduction_for_comms(True)`` (torch 2.8+) asks of one
module (the public API replaces this patch there):

* 2.8: the function takes ``force_sum_reduction_for_comms``; the wrapper passes True.
* 2.7: it returns ``(pre, post)`` divide factors and ``foreach_reduce`` asks for AVG when
  ``pre`` is None; the wrapper returns ``(1.0, shard group size)``: a sum (a divide
  factor of 1 divides nothing), then one division after the reduction. HSDP is left
  alone on 2.7: its replicate all-reduce asks gloo for AVG too ("Cannot use ReduceOp.AVG
  with Gloo"), and with a sum instead it reaches bookkeeping that needs device events,
  which CPU streams do not record (``assert all_reduce_event is not None``); HSDP on
  gloo does not work on 2.7 either way, and the AVG error is the clearer one.

Other devices and backends, fp16 (already summed with its own factors) and custom divide
factors (2.7: ``post`` already set) pass through unchanged. Not applicable from 2.9, where
gloo averages.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ._compat import applicable, fsdp_internal_module, torch_at_least
from ._wrapping import (
    PatchResult,
    active_wrapper_in_chain,
    already_installed,
    installed,
    make_wrapper,
    not_applicable,
    replace_attribute,
)

__all__ = ["forced_sum", "is_cpu_gloo", "patch_fsdp_gloo_reduce_scatter_avg"]

GLOO_REDUCE_SCATTER_AVG = "gloo_reduce_scatter_avg"
_FUNCTION = "_get_gradient_divide_factors"
_FORCE_SUM = "force_sum_reduction_for_comms"


def is_cpu_gloo(group: Any, device_type: str) -> bool:
    """Whether a reduction of ``device_type`` tensors on ``group`` runs on gloo's CPU backend."""
    if device_type != "cpu" or group is None:
        return False
    try:
        backend = str(torch.distributed.get_backend(group))
    except Exception:  # not a process group torch knows: leave the reduction alone
        return False
    return backend == "gloo" or "cpu:gloo" in backend


def forced_sum(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The patch's behaviour around ``_get_gradient_divide_factors`` (``call``)."""
    bound = inspect.signature(call).bind(*args, **kwargs)
    group, device_type = bound.arguments.get("reduce_scatter_group"), bound.arguments.get("device_type", "")
    if not is_cpu_gloo(group, device_type):
        return call(*args, **kwargs)
    if _FORCE_SUM in inspect.signature(call).parameters:  # 2.8: let FSDP2 sum and divide itself
        bound.arguments[_FORCE_SUM] = True
        return call(*bound.args, **bound.kwargs)
    factors = call(*args, **kwargs)  # 2.7: (pre, post); (None, None) means "ask gloo for AVG"
    if tuple(factors) != (None, None) or bound.arguments.get("all_reduce_group") is not None:
        return factors
    return 1.0, float(group.size())


def patch_fsdp_gloo_reduce_scatter_avg() -> PatchResult:
    """Make FSDP2 sum and divide on gloo instead of asking it for AVG (bug M, torch < 2.9).

    Wraps the current ``_fsdp_collectives._get_gradient_divide_factors``. Not applicable
    from torch 2.9 (gloo averages; a version check, since only a collective could tell),
    nor where the function is gone or takes neither form described in the module.
    """
    reason = applicable()
    if reason is not None:
        return not_applicable(GLOO_REDUCE_SCATTER_AVG, reason)
    if torch_at_least(2, 9):
        return not_applicable(GLOO_REDUCE_SCATTER_AVG, "gloo averages FSDP2's AVG reduce-scatter from torch 2.9")
    collectives = fsdp_internal_module("_fsdp_collectives")
    current = getattr(collectives, _FUNCTION, None)
    if not callable(current):
        return not_applicable(GLOO_REDUCE_SCATTER_AVG, f"_fsdp_collectives.{_FUNCTION} not found")
    parameters = inspect.signature(current).parameters
    if "reduce_scatter_group" not in parameters or "device_type" not in parameters:
        return not_applicable(GLOO_REDUCE_SCATTER_AVG, f"_fsdp_collectives.{_FUNCTION} has an unknown signature")
    if active_wrapper_in_chain(current, GLOO_REDUCE_SCATTER_AVG):
        return already_installed(GLOO_REDUCE_SCATTER_AVG)
    wrapper = make_wrapper(current, GLOO_REDUCE_SCATTER_AVG, forced_sum)
    return installed(GLOO_REDUCE_SCATTER_AVG, f"wrapped {replace_attribute(collectives, _FUNCTION, wrapper)}")
