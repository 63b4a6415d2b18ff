"""E across steps: ``sometimes`` is used in step 1 only, and ``zero_grad(set_to_none=False)`` runs after it.

With unused-param reduction on, steps 0 and 2 zero-fill ``sometimes``. In step 0 it never
had a grad, so E's patch must give it back None (no weight decay, no optimizer state);
in step 2 it still holds the zeros that ``zero_grad(set_to_none=False)`` left, which
plain autograd keeps too (AdamW steps it), so the patch must leave that grad alone.
"""

from harness.spec import Expect, Scenario, Sharding, accumulate, mean_square
from scenarios._models import Gated, randn_batch

SCENARIO = Scenario(
    model=lambda: Gated("sometimes"),
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x, use=("sometimes",) if ctx.step == 1 else ())),
    sharding=Sharding(reduce_scatter_unused_params=True),
    schedule=accumulate(2),
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    expect=(Expect(status="mismatch", torch=">=2.13", match="reference None", fixed_by="restore_unused_param_grads"),),
)
