"""G: scaling accumulated grads with CPU offload.

``p.grad *= scaler`` with a 0-dim scaler on the accelerator and grads on the host raises
"Expected all tensors to be on the same device" on CUDA. On a CPU-only machine the
scaler is on the CPU too, so this cell checks the numbers only.
"""


from harness.spec import Expect, Scenario, Sharding, accumulate
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), offload=True),
    schedule=accumulate(2),
    grad_scale=0.25,
    patches=("scale_grads",),
    bug_devices=("cuda",),
    expect=(Expect(status="error", devices=("cuda",), match="Expected all tensors to be on the same device",
                   fixed_by="scale_grads"),),
)
