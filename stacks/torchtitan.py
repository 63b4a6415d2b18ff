"""torchtitan 0.3.0: its gradient clipping, with and without expert parallelism.

``torchtitan.distributed.utils.clip_grad_norm_`` is torch's ``get_total_norm`` plus a
reduction over pipeline stages; with ``ep_enabled=True`` it splits the grads by whether their
mesh has a dim named "ep", takes one norm per group and combines them (bug J on stock torch).
The file imports torchtitan's config, logger and ``spmd_types``; only the two functions and
what they reach are loaded (``harness.undertest.extract``).
"""

from __future__ import annotations

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "torchtitan/distributed/utils.py"

STACK = Stack(name="torchtitan", version="0.3.0", dist="torchtitan", judged=(
    Judged(function="clip_grad_norm_(..., ep_enabled=True)", where=FILE, bugs="J", patch="clip_grad_norm",
           shim="clip_grad_norm_ep_", scenarios=("j2_clip_ep_mesh",)),
    Judged(function="clip_grad_norm_", where=FILE, bugs="F, H", patch="clip_grad_norm", shim="clip_grad_norm_",
           scenarios=("h_inf_norm_empty_shard", "f_offload_clip_nccl_only", "hsdp_clip")),
))

# -- shims: this project's code, calling torchtitan's as it ships
_CODE = StackCode(STACK, FILE, ("clip_grad_norm_",))


def clip_grad_norm_ep_(parameters, max_norm, norm_type=2.0):
    """The expert-parallel path, as torchtitan's trainer calls it for an EP model."""
    return _CODE.clip_grad_norm_(parameters, max_norm, norm_type, ep_enabled=True)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    return _CODE.clip_grad_norm_(parameters, max_norm, norm_type)
