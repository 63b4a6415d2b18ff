"""verl 0.9.1: ``fsdp2_clip_grad_norm_`` and ``set_reshard_after_forward`` (``verl/utils/fsdp_utils.py``).

``set_reshard_after_forward(module, value, recurse=True)`` is verl's backport of torch 2.8's
setter: it sets each FSDP module's ``post_forward_mesh_info`` (bug U's fix: the output head kept
gathered for a loss that reads its weight outside the head's forward). verl binds the two
torch names it needs (``FSDPModule``, ``_fsdp_init._get_post_forward_mesh_info``) under a torch
version check the loader does not run; the shim imports them as that check does for
torch >= 2.6.

It takes torch's total norm and moves it to ``get_device_id()`` before clipping, for grads
offloaded to the host (bug F). ``get_device_id`` asks verl's platform layer, which falls back
to NVIDIA where it finds no accelerator: on a CPU-only machine it asks
``torch.cuda.current_device()``, so the function cannot be judged on CPU. The shim gives it
that same answer (the NVIDIA platform's) without verl's platform package.
"""

from __future__ import annotations

import functools

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "verl/utils/fsdp_utils.py"
CPU = ("moves the norm to get_device_id(): verl's platform layer falls back to NVIDIA without an accelerator "
       "(torch.cuda.current_device() on a CPU-only machine)")

STACK = Stack(name="verl", version="0.9.1", dist="verl", judged=(
    Judged(function="fsdp2_clip_grad_norm_", where=FILE, bugs="F", patch="clip_grad_norm", shim="clip_grad_norm_",
           scenarios=("f_offload_clip_nccl_only", "f_offload_clip_mixed_backend", "h_inf_norm_empty_shard"), cpu=CPU),
    Judged(function="set_reshard_after_forward", where=FILE, bugs="U", patch="set_reshard_after_forward",
           shim="set_reshard_after_forward_", scenarios=("u_weight_outside_forward",)),
))


# -- shims: this project's code, calling verl's as it ships
def _nvidia_device_id() -> int:
    import torch

    return torch.cuda.current_device()


_CODE = StackCode(STACK, FILE, ("fsdp2_clip_grad_norm_",), provide={"get_device_id": _nvidia_device_id})


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    return _CODE.fsdp2_clip_grad_norm_(parameters, max_norm, norm_type)


@functools.cache
def _reshard_code() -> StackCode:
    import torch.distributed.fsdp as fsdp
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_post_forward_mesh_info

    return StackCode(STACK, FILE, ("set_reshard_after_forward",), provide={
        "FSDPModule": fsdp.FSDPModule, "_get_post_forward_mesh_info": _get_post_forward_mesh_info})


def set_reshard_after_forward_(module, reshard_after_forward, recurse=True):
    return _reshard_code().set_reshard_after_forward(module, reshard_after_forward, recurse)
