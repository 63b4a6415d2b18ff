"""NeMo Automodel 0.7.0: ``apply_torch_patches`` (``nemo_automodel/shared/torch_patches.py``)
and its sharding-aware gradient clipping.

Its third part registers a DTensor sharding strategy for ``aten.alias.default`` (bug R), but
only where ``torch.__version__``'s base version is exactly "2.9.0"; 2.9.1 has the bug too. The
shim calls the whole function, as the stack does (its other parts: a torchdata
``pin_memory`` shim and a DeviceMesh fix, gated on their own).

``clip_grad_norm(max_grad_norm, model_parts, ...)`` (``nemo_automodel/components/training/utils.py``)
groups the grads by mesh and placements, takes one norm per group and combines them (bugs F,
H, J). Its fused multi-tensor kernels need triton, which a CPU-only machine lacks: the module
then has ``HAVE_TRITON`` false and falls back to its reference reduction, which is what the
shim provides (``HAVE_FUSED_GRAD_NORM=False``; the Transformer Engine backend is not asked for).
"""

from __future__ import annotations

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "nemo_automodel/shared/torch_patches.py"
CLIP_FILE = "nemo_automodel/components/training/utils.py"

STACK = Stack(name="nemo-automodel", version="0.7.0", dist="nemo-automodel", judged=(
    Judged(function="apply_torch_patches (part 3: aten.alias strategy)", where=FILE, bugs="R",
           patch="alias_sharding_strategy", shim="patch_apply_torch_patches", scenarios=("r_dtensor_alias_slice",)),
    Judged(function="clip_grad_norm", where=CLIP_FILE, bugs="F, H, J", patch="clip_grad_norm", shim="clip_grad_norm_",
           scenarios=("h_inf_norm_empty_shard", "f_offload_clip_nccl_only", "j_clip_two_meshes", "hsdp_clip")),
))

# -- shims: this project's code, calling NeMo Automodel's as it ships
_CODE = StackCode(STACK, FILE, ("apply_torch_patches",))


def _no_module(*args, **kwargs):
    return False, None


_CLIP = StackCode(STACK, CLIP_FILE, ("clip_grad_norm",), provide={
    "HAVE_FUSED_GRAD_NORM": False, "multi_tensor_absmax": None, "multi_tensor_sumsq": None,
    "safe_import": _no_module, "safe_import_te": _no_module})


class _Parts:
    """The model part ``clip_grad_norm`` walks (``parameters()``), holding the parameters given."""

    def __init__(self, params) -> None:
        self.params = list(params)

    def parameters(self):
        return iter(self.params)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """As NeMo Automodel's recipes call it: ``clip_grad_norm(max_grad_norm, model_parts, norm_type=...)``."""
    return _CLIP.clip_grad_norm(max_norm, [_Parts(parameters)], norm_type=norm_type)


def patch_apply_torch_patches() -> None:
    _CODE.apply_torch_patches()
