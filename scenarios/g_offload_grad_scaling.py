"""G: scaling accumulated grads with CPU offload.

``p.grad *= scaler`` with a 0-dim scaler on the accelerator and grads on the host raises
"Expected all tensors to be on the same device" on CUDA. On a CPU-only machine the
scaler is on the CPU too, so this cell checks the numbers only.

From torch 2.8 no scaling pass is needed: ``FSDPModule.set_gradient_divide_factor``
divides by ``data-parallel size / grad_scale`` inside the reduction, where the grads are
(the ``api`` variant; set on every FSDP module, since it does not recurse, and with
``set_force_sum_reduction_for_comms``, since gloo has no pre-multiplied sum). On one rank
torch 2.10 .. 2.15 then divide twice: the single-rank path copies the grads divided by the
factor, and the forced sum's post-division divides them again (grads ``factor`` times too
small; measured, no upstream issue found).
"""


from harness.spec import Expect, PublicApi, Scenario, Sharding, accumulate, grads_scaled
from scenarios._models import MLP, randn_batch

GRAD_SCALE = 0.25


def _divide_in_reduction(module, dp_world: int) -> None:
    module.set_force_sum_reduction_for_comms(True)
    module.set_gradient_divide_factor(dp_world / GRAD_SCALE)


SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), offload=True),
    schedule=accumulate(2),
    grad_scale=GRAD_SCALE,
    patches=("scale_grads",),
    api=PublicApi(name="FSDPModule.set_gradient_divide_factor", since="2.8", replaces=("scale_grads",),
                  needs=("FSDPModule.set_force_sum_reduction_for_comms",), configure=_divide_in_reduction,
                  scales_grads=True, reference_quirks=False),
    bug_devices=("cuda",),
    expect=(Expect(status="error", devices=("cuda",), match="Expected all tensors to be on the same device",
                   fixed_by="scale_grads"),
            Expect(status="mismatch", torch=">=2.10", variants=("api",), world_sizes=(1,),
                   symptom=grads_scaled(GRAD_SCALE),
                   why="one rank, forced sum and a divide factor: torch divides by the factor twice"),),
)
