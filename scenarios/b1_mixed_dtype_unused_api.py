"""B1: unused-param reduction on (public API), ``unused`` never used, bf16 params / fp32 reduce.

The zero fill for ``unused`` is bf16 while ``used``'s accumulated grad is already fp32:
foreach_reduce asserts "uniform gradient dtype". Fixed by widening the group to fp32.
"""

from harness.spec import Expect, Scenario, accumulate, mean_square
from scenarios._mixed import UsedUnused, batch, sharding

SCENARIO = Scenario(
    model=UsedUnused,
    batch=batch,
    forward=lambda model, x, ctx: mean_square(model(x, use_unused=False)),
    sharding=sharding(api=True),
    schedule=accumulate(2),
    unused_grads="zero",  # what the public API documents: unused params get a zero grad
    patches=("unused_param_reduction", "uniform_reduce_dtype"),
    expect=(Expect(status="error", torch=">=2.13,<2.15", match="uniform gradient dtype"),),
)
