"""B3: API on, ``unused`` used every micro-batch on rank 0 only.

Only the other ranks assert ("uniform gradient dtype"); rank 0 blocks in the
reduce-scatter (gloo: connection closed by peer; NCCL: hang).
"""

from harness.spec import HANG, Expect, Scenario, accumulate, mean_square
from scenarios._mixed import sharding
from scenarios._models import Gated, randn_batch


def forward(model, x, ctx):
    return mean_square(model(x, use=("unused",) if ctx.rank == 0 else ()))


SCENARIO = Scenario(
    model=lambda: Gated("unused"),
    batch=randn_batch(),
    forward=forward,
    sharding=sharding(api=True),
    schedule=accumulate(2),
    world_sizes=(2, 4),
    patches=("unused_param_reduction", "uniform_reduce_dtype"),
    timeout_s=20,
    expect=(
        Expect(status="error", torch=">=2.13,<2.15", match="uniform gradient dtype", devices=("cpu",),
               fixed_by="uniform_reduce_dtype", why="rank 1 asserts; its error is blamed, not rank 0's wait"),
        Expect(status="error|hang", torch=">=2.13,<2.15", devices=("cuda",), fixed_by="uniform_reduce_dtype",
               match={"error": "uniform gradient dtype", "hang": HANG}),
    ),
)
