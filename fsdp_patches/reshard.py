"""``set_reshard_after_forward`` where torch lacks the public setter (torch 2.7; bug U).

Whether FSDP2 frees a unit's unsharded parameters at the end of its forward is the unit's
reshard-after-forward. Stacks change it while training: a loss that reads the output head's
weight outside the head's forward (a fused linear cross-entropy) needs the head still
gathered after its forward, and evaluation or generation between steps wants it resharded
again. torch has ``FSDPModule.set_reshard_after_forward(value, recurse=True)`` from 2.8.
Before that the value lives only in each param group's ``post_forward_mesh_info``: the mesh
the group reshards to after forward, ``None`` to keep it unsharded, set once by
``fully_shard``.

``set_reshard_after_forward(module, value, recurse=True)`` calls torch's setter where the
module has it, else sets ``post_forward_mesh_info`` of every param group of ``module`` (and
of every FSDP module under it with ``recurse``) to what ``fully_shard`` gives for ``value``.
On torch 2.7 the root's first forward still sets the root's own groups to keep their
parameters (FSDP2 never reshards the root after forward there): call it on the root after
the first forward, or on the other units at any time.
"""

from __future__ import annotations

import torch.nn as nn

from ._compat import fsdp_internal_module, param_groups_of_module

__all__ = ["set_reshard_after_forward"]


def set_reshard_after_forward(module: nn.Module, reshard_after_forward: bool, recurse: bool = True) -> None:
    """Reshard ``module``'s parameters after its forward, or keep them gathered until backward."""
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"set_reshard_after_forward: a bool, not {reshard_after_forward!r}")
    public = getattr(module, "set_reshard_after_forward", None)
    if public is not None:
        public(reshard_after_forward, recurse=recurse)
        return
    if not hasattr(module, "_get_fsdp_state"):
        raise ValueError(f"set_reshard_after_forward: {type(module).__name__} is not a fully_shard-ed module")
    _set_post_forward(module, reshard_after_forward, recurse)


def _set_post_forward(module: nn.Module, reshard_after_forward: bool, recurse: bool) -> None:
    init = fsdp_internal_module("_fsdp_init")
    if init is None or not hasattr(init, "_get_post_forward_mesh_info"):
        raise RuntimeError("set_reshard_after_forward: this torch has neither FSDPModule.set_reshard_after_forward "
                           "nor _fsdp_init._get_post_forward_mesh_info")
    for sub in module.modules() if recurse else (module,):
        for group in param_groups_of_module(sub):
            group.post_forward_mesh_info = init._get_post_forward_mesh_info(reshard_after_forward, group.mesh_info)
