"""E under HSDP with a deferred all-reduce: a parameter no rank uses keeps a None grad, one only rank 0 uses keeps its grad.

The "was it used" decision must span the shard and the replicate groups and the whole
accumulation window: with the public API on, ``unused`` (no rank) must end with no grad
and no optimizer state, and ``rare`` (rank 0 only) with the mean over ranks on every
rank. Deciding over the shard group alone drops ``rare`` on the other replicas.
"""

from harness.spec import Expect, Scenario, Sharding, mean_square
from scenarios._hsdp_usage import DEFERRED, GLOO_NO_AVG
from scenarios._models import Gated, randn_batch

SCENARIO = Scenario(
    model=lambda: Gated("rare", "unused"),
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x, use=("rare",) if ctx.rank == 0 else ())),
    sharding=Sharding(replicate=2, reduce_scatter_unused_params=True),
    schedule=DEFERRED,
    world_sizes=(2, 4),
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    expect=(GLOO_NO_AVG, Expect(status="mismatch", torch=">=2.13", match="reference None",
                                fixed_by="restore_unused_param_grads")),
)
