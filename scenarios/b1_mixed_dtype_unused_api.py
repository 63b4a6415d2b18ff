"""B1: unused-param reduction on (public API), ``unused`` never used, bf16 params / fp32 reduce.

The zero fill for ``unused`` is bf16 while ``used``'s accumulated grad is already fp32:
foreach_reduce asserts "uniform gradient dtype" (2.13, 2.14). Fixed by widening the group
to fp32. The zero fill itself is bug E (a never-used parameter must keep a None grad), so
the patch set includes E's patch, and from 2.15 (no assertion) E is what vanilla shows.
Before 2.13 the API is missing: vanilla is skipped and the patch set backports it.
"""

from harness.spec import Expect, Scenario, accumulate, mean_square
from scenarios._mixed import sharding
from scenarios._models import Gated, randn_batch

SCENARIO = Scenario(
    model=lambda: Gated("unused"),
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x)),
    sharding=sharding(api=True),
    schedule=accumulate(2),
    patches=("unused_param_reduction", "uniform_reduce_dtype", "restore_unused_param_grads"),
    expect=(
        Expect(status="error", torch=">=2.13,<2.15", match="uniform gradient dtype", fixed_by="uniform_reduce_dtype"),
        Expect(status="mismatch", torch=">=2.15", match="reference None", fixed_by="restore_unused_param_grads",
               why="E: the public API zero-fills the never-used parameter, AdamW then steps it"),
    ),
)
