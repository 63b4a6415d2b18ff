"""torchtune 0.6.1: ``training.scale_grads(model, scaler)`` (``torchtune/training/_grad_scaler.py``).

It moves the scaler to the first parameter's device before multiplying the grads (bug G: a
scaler on the accelerator and grads offloaded to the host). The bug shows only where grads
are offloaded from an accelerator; on CPU the cells check its values.
"""

from __future__ import annotations

from harness.undertest.stacks import Judged, Stack, StackCode

FILE = "torchtune/training/_grad_scaler.py"

STACK = Stack(name="torchtune", version="0.6.1", dist="torchtune", judged=(
    Judged(function="training.scale_grads", where=FILE, bugs="G", patch="scale_grads", shim="scale_grads_",
           scenarios=("g_offload_grad_scaling", "pure_bf16")),
))

# -- shims: this project's code, calling torchtune's as it ships
_CODE = StackCode(STACK, FILE, ("scale_grads",))


class _Owner:
    """The model torchtune's ``scale_grads`` expects: what owns the parameters."""

    def __init__(self, params) -> None:
        self.params = list(params)

    def parameters(self):
        return iter(self.params)


def scale_grads_(params, scaler) -> None:
    _CODE.scale_grads(_Owner(params), scaler)
