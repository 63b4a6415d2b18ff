"""E across steps, the other way round: ``sometimes`` is used in step 0 only, then set to None.

``zero_grad(set_to_none=True)`` runs after step 0.

With unused-param reduction on, step 1 zero-fills ``sometimes``: it had no grad left from
step 0 (set to None), so E's patch must give it back None again. A patch whose "used in this
window" flag outlives the window (never reset after step 0) keeps the zero grad, and AdamW
decays the weight. ``e_param_used_in_one_step`` (used in step 1 only) cannot show that.
"""

from harness.spec import mean_square
from scenarios.e_param_used_in_one_step import SCENARIO as USED_IN_STEP_1

SCENARIO = USED_IN_STEP_1.replace(
    forward=lambda model, x, ctx: mean_square(model(x, use=("sometimes",) if ctx.step == 0 else ())),
    world_sizes=(2, 4),
)
