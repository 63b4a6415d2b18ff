"""E: unused-param reduction on, and a parameter no rank uses: AdamW must not step it.

With the reduction on, the reduce-scatter turns the missing grad into an exact zero;
AdamW then applies weight decay and creates state. Expected: grad None, weight
unchanged, no optimizer state (the reference's plain autograd semantics).
"""

from harness.spec import Expect, Scenario, Sharding, accumulate, mean_square
from scenarios._models import Gated, randn_batch

SCENARIO = Scenario(
    model=lambda: Gated("unused"),
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x)),
    sharding=Sharding(reduce_scatter_unused_params=True),
    schedule=accumulate(2),
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    expect=(Expect(status="mismatch", torch=">=2.13", match="reference None", fixed_by="restore_unused_param_grads"),),
)
