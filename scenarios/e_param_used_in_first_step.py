"""E across steps, the other way round: ``sometimes`` is used in step 0 only, and
``zero_grad(set_to_none=True)`` runs after it.

With unused-param reduction on, step 1 zero-fills ``sometimes``: it had no grad left from
step 0 (set to None), so E's patch must give it back None again. A patch whose "used in this
window" flag outlives the window (never reset after step 0) keeps the zero grad, and AdamW
decays the weight. ``e_param_used_in_one_step`` (used in step 1 only) cannot show that.
"""

from harness.spec import Expect, Scenario, Sharding, accumulate, mean_square
from scenarios._models import Gated, randn_batch

SCENARIO = Scenario(
    model=lambda: Gated("sometimes"),
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x, use=("sometimes",) if ctx.step == 0 else ())),
    sharding=Sharding(reduce_scatter_unused_params=True),
    schedule=accumulate(2),
    world_sizes=(2, 4),
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    expect=(Expect(status="mismatch", torch=">=2.13", match="reference None", fixed_by="restore_unused_param_grads"),),
)
