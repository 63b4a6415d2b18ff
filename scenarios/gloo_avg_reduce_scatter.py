"""Upstream bug: before torch 2.9 gloo computes FSDP2's AVG reduce-scatter as a sum (pytorch/pytorch#162338).

A silent-correctness bug: on CPU, torch 2.7 and 2.8 give grads shard-size times too large.
Every other scenario's reference models the sum on those versions, so that they can judge
the patches (their records and the report name that adjustment); this one judges
against the true mean, so the bug itself is reported. The public API
``FSDPModule.set_force_sum_reduction_for_comms(True)`` (torch 2.8+, on every FSDP module:
it does not recurse) makes FSDP2 sum and divide by itself, which avoids it on 2.8 (the
``api`` variant). ``fsdp_patches.gloo_avg`` does the same for every gloo reduction on
2.7 and 2.8; it is not in the module's patch set, because the deployed set would then
average where every other scenario's reference models the sum.
"""

from harness.spec import Expect, PublicApi, Scenario
from scenarios._models import MLP, randn_batch

FORCE_SUM_API = PublicApi(name="FSDPModule.set_force_sum_reduction_for_comms", since="2.8", replaces=(), reference_quirks=False,
                          configure=lambda module, dp_world: module.set_force_sum_reduction_for_comms(True))

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    world_sizes=(2, 4),
    devices=("cpu",),
    reference_quirks=False,
    api=FORCE_SUM_API,
    expect=(Expect(status="mismatch", torch="<2.9", variants=("vanilla", "deployed"), devices=("cpu",),
                   upstream="pytorch/pytorch#162338",
                   why="gloo sums where FSDP2 asks for ReduceOp.AVG: grads come out world-size times too large"),),
)
