"""B2: no API; ``unused`` is used only in the last (syncing) micro-batch.

Its fresh bf16 grad meets ``used``'s fp32 accumulated grad in one reduce-scatter group:
"uniform gradient dtype" assertion, even at world size 1.
"""

from harness.spec import Expect, Scenario, accumulate, mean_square
from scenarios._mixed import sharding
from scenarios._models import Gated, randn_batch


def forward(model, x, ctx):
    return mean_square(model(x, use=("unused",) if ctx.micro_batch == 1 else ()))


SCENARIO = Scenario(
    model=lambda: Gated("unused"),
    batch=randn_batch(),
    forward=forward,
    sharding=sharding(api=False),
    schedule=accumulate(2),
    patches=("uniform_reduce_dtype",),
    expect=(Expect(status="error", torch="<2.15", match="uniform gradient dtype", fixed_by="uniform_reduce_dtype"),),
)
