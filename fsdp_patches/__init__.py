"""Process-global monkeypatches for PyTorch FSDP2 (``fully_shard``), torch 2.7 .. 2.15.

Each ``patch_fsdp_*`` function takes no arguments, wraps the *current* value of what
it changes (a wrapper other code installed first keeps running inside ours), is
idempotent (a second call finds its marked wrapper and returns "already-installed"),
picks its implementation by feature detection first and torch version second, and
returns "not-applicable" with a reason instead of raising where its target is gone or
the bug is fixed natively.

* ``patch_fsdp_unused_param_reduction`` (bug A): ranks that use different parameters.
* ``patch_fsdp_uniform_reduce_dtype`` (bug B): mixed grad dtypes in one reduce-scatter.
* ``patch_fsdp_accumulated_grad_guard`` (bug C): a unit that never ran forward.
* ``patch_fsdp_restore_unused_param_grads`` (bug E): no rank used a parameter.
* ``patch_fsdp_late_unfreeze_reduce_dtype`` (bug I): a unit frozen in its first forward,
  unfrozen later, under mixed precision.
* ``patch_fsdp_gloo_reduce_scatter_avg`` (bug M): gloo sums FSDP2's AVG reduce-scatter
  (torch < 2.9, CPU).
* ``patch_fsdp_meta_init_full_rng`` (bug N): random init of sharded parameters (meta-device
  init) draws the full tensor and keeps this rank's slice; ``init_full_then_shard`` also exported.
* ``patch_fsdp_shard_by_dtype`` (bug K): parameters of several dtypes in one unit; it
  wraps ``torch.distributed.fsdp.fully_shard`` with ``fully_shard_by_dtype``, also exported.
* ``patch_fsdp_nonfloat_params`` (bug Q): a frozen non-float parameter (torch < 2.12).
* ``patch_alias_sharding_strategy`` (bug R): ``aten.alias.default`` without a DTensor
  sharding strategy (torch 2.9).

``apply_all`` installs all ten in a working order (``PATCHES``: A before E, which sits
around A). The gradient
utilities ``clip_grad_norm_``, ``get_total_grad_norm`` and ``scale_grads_`` (bugs F, G,
H) are re-exported from ``fsdp_patches.grads``; ``finalize_backward(root)`` (bug O) reduces the
grads of an accumulation window run with gradient sync off, from ``fsdp_patches.finalize``;
``set_reshard_after_forward(module, value)`` (bug U) is torch 2.8's setter for torch 2.7,
from ``fsdp_patches.reshard``.

Undo: ``result.undo()`` on any ``PatchResult`` takes that patch out again, and
``undo_all()`` takes out every patch installed. Where our wrapper is still the
attribute's value, the value it wrapped is put back; where other code wrapped ours
since, ours turns into a pass-through so their chain keeps working. Undo is idempotent
and a later install works again.
"""

from __future__ import annotations

from collections.abc import Callable

from ._wrapping import PatchResult, undo_all
from .accumulated_grad import patch_fsdp_accumulated_grad_guard
from .alias_strategy import patch_alias_sharding_strategy
from .by_dtype import fully_shard_by_dtype, patch_fsdp_shard_by_dtype
from .finalize import finalize_backward
from .gloo_avg import patch_fsdp_gloo_reduce_scatter_avg
from .grads import clip_grad_norm_, get_total_grad_norm, scale_grads_
from .meta_init import init_full_then_shard, patch_fsdp_meta_init_full_rng
from .nonfloat import patch_fsdp_nonfloat_params
from .reduce_dtype import patch_fsdp_uniform_reduce_dtype
from .reshard import set_reshard_after_forward
from .unfreeze import patch_fsdp_late_unfreeze_reduce_dtype
from .unused_params import (
    patch_fsdp_restore_unused_param_grads,
    patch_fsdp_unused_param_reduction,
)

__all__ = [
    "PATCHES",
    "PatchResult",
    "apply_all",
    "clip_grad_norm_",
    "finalize_backward",
    "fully_shard_by_dtype",
    "get_total_grad_norm",
    "init_full_then_shard",
    "patch_alias_sharding_strategy",
    "patch_fsdp_accumulated_grad_guard",
    "patch_fsdp_gloo_reduce_scatter_avg",
    "patch_fsdp_late_unfreeze_reduce_dtype",
    "patch_fsdp_meta_init_full_rng",
    "patch_fsdp_nonfloat_params",
    "patch_fsdp_restore_unused_param_grads",
    "patch_fsdp_shard_by_dtype",
    "patch_fsdp_uniform_reduce_dtype",
    "patch_fsdp_unused_param_reduction",
    "scale_grads_",
    "set_reshard_after_forward",
    "undo_all",
]

#: Short patch name -> install function, in the order ``apply_all`` uses.
PATCHES: dict[str, Callable[[], PatchResult]] = {
    "unused_param_reduction": patch_fsdp_unused_param_reduction,
    "uniform_reduce_dtype": patch_fsdp_uniform_reduce_dtype,
    "accumulated_grad_guard": patch_fsdp_accumulated_grad_guard,
    "restore_unused_param_grads": patch_fsdp_restore_unused_param_grads,
    "shard_by_dtype": patch_fsdp_shard_by_dtype,
    "late_unfreeze_reduce_dtype": patch_fsdp_late_unfreeze_reduce_dtype,
    "gloo_reduce_scatter_avg": patch_fsdp_gloo_reduce_scatter_avg,
    "meta_init_full_rng": patch_fsdp_meta_init_full_rng,
    "alias_sharding_strategy": patch_alias_sharding_strategy,
    "nonfloat_params": patch_fsdp_nonfloat_params,
}


def apply_all() -> dict[str, PatchResult]:
    """Install every patch of ``PATCHES`` in its order (E after A, which it sits around); the results by name."""
    return {name: install() for name, install in PATCHES.items()}
