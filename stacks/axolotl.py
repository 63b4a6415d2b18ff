"""axolotl 0.19.0: ``nonfloat_param_guard`` and its expert-parallel clipping.

A context manager axolotl enters around sharding a model with packed (non-float) weights
(bug Q): it freezes non-float parameters and, while open, makes ``nn.Parameter`` of non-float
data not require grad. The shim opens it around every ``fully_shard`` call.

``_ep_aware_clip_grad_norm`` (``axolotl/monkeypatch/accelerate/parallelism_config.py``) is what
axolotl's patched ``Accelerator.clip_grad_norm_`` calls when expert parallelism is composed with
data sharding: one p-norm of every rank's local grads, summed over the default group (bug J:
grads on several meshes). It is judged as a clip, also where no expert dim exists (F, H and
the HSDP clip), since it is the whole clip its users get. axolotl's clipping of local shards
and its dtype carving (F, H, K) are in later releases than the package index here has
(0.19.0 is its newest).
"""

from __future__ import annotations

import logging

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "axolotl/monkeypatch/accelerate/fsdp2_quantized.py"
EP_FILE = "axolotl/monkeypatch/accelerate/parallelism_config.py"

STACK = Stack(name="axolotl", version="0.19.0", dist="axolotl", judged=(
    Judged(function="nonfloat_param_guard", where=FILE, bugs="Q", patch="nonfloat_params",
           shim="patch_nonfloat_param_guard", scenarios=("q_frozen_uint8_param",)),
    Judged(function="_ep_aware_clip_grad_norm", where=EP_FILE, bugs="J, F, H", patch="clip_grad_norm",
           shim="clip_grad_norm_ep_", scenarios=("j2_clip_ep_mesh", "j_clip_two_meshes", "h_inf_norm_empty_shard",
                                                 "f_offload_clip_nccl_only", "hsdp_clip")),
))

# -- shims: this project's code, calling axolotl's as it ships
_CODE = StackCode(STACK, FILE, ("nonfloat_param_guard",), provide={"LOG": logging.getLogger("axolotl")})
_EP = StackCode(STACK, EP_FILE, ("_ep_aware_clip_grad_norm",))


def clip_grad_norm_ep_(parameters, max_norm, norm_type=2.0):
    """As axolotl's patched ``Accelerator.clip_grad_norm_`` calls it (after unscaling)."""
    return _EP._ep_aware_clip_grad_norm(list(parameters), max_norm, norm_type=norm_type)


class _Modules:
    """What ``nonfloat_param_guard(model)`` reads (``parameters()``) for one module or several."""

    def __init__(self, modules) -> None:
        self.modules = list(modules) if isinstance(modules, (list, tuple)) else [modules]

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()


def patch_nonfloat_param_guard() -> None:
    """Every ``torch.distributed.fsdp.fully_shard`` call runs inside the guard."""
    import functools

    import torch.distributed.fsdp as fsdp

    guard, inner = _CODE.nonfloat_param_guard, fsdp.fully_shard

    @functools.wraps(inner)
    def fully_shard(module, *args, **kwargs):
        with guard(_Modules(module)):
            return inner(module, *args, **kwargs)

    fsdp.fully_shard = fully_shard
