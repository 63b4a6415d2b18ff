"""NeMo Automodel 0.7.0: ``apply_torch_patches`` (``nemo_automodel/shared/torch_patches.py``).

Its third part registers a DTensor sharding strategy for ``aten.alias.default`` (bug R), but
only where ``torch.__version__``'s base version is exactly "2.9.0"; 2.9.1 has the bug too. The
shim calls the whole function, as the stack does (its other parts: a torchdata
``pin_memory`` shim and a DeviceMesh fix, gated on their own).
"""

from __future__ import annotations

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "nemo_automodel/shared/torch_patches.py"

STACK = Stack(name="nemo-automodel", version="0.7.0", dist="nemo-automodel", judged=(
    Judged(function="apply_torch_patches (part 3: aten.alias strategy)", where=FILE, bugs="R",
           patch="alias_sharding_strategy", shim="patch_apply_torch_patches", scenarios=("r_dtensor_alias_slice",)),
))

# -- shims: this project's code, calling NeMo Automodel's as it ships
_CODE = StackCode(STACK, FILE, ("apply_torch_patches",))


def patch_apply_torch_patches() -> None:
    _CODE.apply_torch_patches()
