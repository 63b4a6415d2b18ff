"""verl 0.9.1: ``fsdp2_clip_grad_norm_`` (``verl/utils/fsdp_utils.py``), its FSDP2 clipping.

It takes torch's total norm and moves it to ``get_device_id()`` before clipping, for grads
offloaded to the host (bug F). ``get_device_id`` asks verl's platform layer, which falls back
to NVIDIA where it finds no accelerator: on a CPU-only machine it asks
``torch.cuda.current_device()``, so the function cannot be judged on CPU. The shim gives it
that same answer (the NVIDIA platform's) without verl's platform package.
"""

from __future__ import annotations

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "verl/utils/fsdp_utils.py"
CPU = ("moves the norm to get_device_id(): verl's platform layer falls back to NVIDIA without an accelerator "
       "(torch.cuda.current_device() on a CPU-only machine)")

STACK = Stack(name="verl", version="0.9.1", dist="verl", judged=(
    Judged(function="fsdp2_clip_grad_norm_", where=FILE, bugs="F", patch="clip_grad_norm", shim="clip_grad_norm_",
           scenarios=("f_offload_clip_nccl_only", "f_offload_clip_mixed_backend", "h_inf_norm_empty_shard"), cpu=CPU),
))


# -- shims: this project's code, calling verl's as it ships
def _nvidia_device_id() -> int:
    import torch

    return torch.cuda.current_device()


_CODE = StackCode(STACK, FILE, ("fsdp2_clip_grad_norm_",), provide={"get_device_id": _nvidia_device_id})


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    return _CODE.fsdp2_clip_grad_norm_(parameters, max_norm, norm_type)
