"""axolotl 0.19.0: ``nonfloat_param_guard`` (``axolotl/monkeypatch/accelerate/fsdp2_quantized.py``).

A context manager axolotl enters around sharding a model with packed (non-float) weights
(bug Q): it freezes non-float parameters and, while open, makes ``nn.Parameter`` of non-float
data not require grad. The shim opens it around every ``fully_shard`` call. axolotl's clipping
of local shards and its dtype carving (F, H, J, K) are in later releases than the package
index here has (0.19.0 is its newest).
"""

from __future__ import annotations

import logging

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "axolotl/monkeypatch/accelerate/fsdp2_quantized.py"

STACK = Stack(name="axolotl", version="0.19.0", dist="axolotl", judged=(
    Judged(function="nonfloat_param_guard", where=FILE, bugs="Q", patch="nonfloat_params",
           shim="patch_nonfloat_param_guard", scenarios=("q_frozen_uint8_param",)),
))

# -- shims: this project's code, calling axolotl's as it ships
_CODE = StackCode(STACK, FILE, ("nonfloat_param_guard",), provide={"LOG": logging.getLogger("axolotl")})


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
