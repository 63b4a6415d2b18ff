"""Reduce gradients after the backward passes of an accumulation window (bug O).

MoE and pipeline schedules often learn that a window is over only after its last
backward: the number of micro-batches depends on the data (tokens routed to experts,
a pipeline schedule's actions), so ``set_requires_gradient_sync(True)`` cannot be set
before the last backward. They run every backward with gradient sync off and reduce
afterwards. FSDP2 has no public call for that before torch 2.15; turning sync back on
reduces nothing already accumulated, so the sharded ``.grad`` stays ``None``.

``finalize_backward(root)`` does it on torch 2.7 .. 2.15: it turns gradient sync back
on for every FSDP module under ``root`` and runs the root's end-of-backward callback
once more. That callback runs the post-backward (reduce-scatter, and HSDP's all-reduce
where it is enabled) of every param group not already in post-backward, which after the
window is all of them, then waits for the reductions and clears FSDP2's per-iteration
state. On 2.15 the callback also reads the iteration's finalization mode, which the end
of the window's last backward cleared ("Expected manual backward finalization mode to be
set" without the adaptation below). From torch 2.15 the public ``root.set_manual_backward_finalization
(True)`` before forward plus ``root.finalize_backward()`` after the window do the same.

Call it on the root FSDP module, on every rank, after the window's last backward and
before reading, clipping or scaling the grads. It is collective.
"""

from __future__ import annotations

import torch.nn as nn

__all__ = ["finalize_backward"]


def finalize_backward(root: nn.Module) -> None:
    """Reduce the grads accumulated with gradient sync off; see the module docstring."""
    get_state = getattr(root, "_get_fsdp_state", None)
    if get_state is None:
        raise ValueError(f"finalize_backward: {type(root).__name__} is not a fully_shard-ed module")
    state = get_state()
    is_root = getattr(state, "_is_root", None)
    if is_root is None:  # no forward yet: nothing was accumulated
        return
    if not is_root:
        raise ValueError("finalize_backward: call it on the root FSDP module (the one whose forward ran first)")
    root.set_requires_gradient_sync(True)  # recurses into every FSDP module under root
    root.set_is_last_backward(True)
    ctx = state._state_ctx
    # 2.15+: the end-of-backward callback reads the iteration's finalization mode, which the
    # automatic end of the window's last backward already cleared; this is automatic mode
    if getattr(ctx, "manual_backward_finalization_active", False) is None:
        ctx.manual_backward_finalization_active = False
    state._root_post_backward_final_callback()
