"""Upstream bug: before torch 2.9 gloo computes FSDP2's AVG reduce-scatter as a sum (pytorch/pytorch#162338).

A silent-correctness bug: on CPU, torch 2.7 and 2.8 give grads shard-size times too large.
Every other scenario's reference models the sum where a cell measures it (before
training, with the cell's patch set installed: ``harness.train.probe.reduction_sums``),
so that they can judge the other patches (their records and the report name that
adjustment); this one judges against the true mean, so the bug itself is reported.
``gloo_reduce_scatter_avg`` (``fsdp_patches.gloo_avg``) makes FSDP2 sum and divide by
itself for every gloo reduction on 2.7 and 2.8; the public API
``FSDPModule.set_force_sum_reduction_for_comms(True)`` (torch 2.8+, on every FSDP module:
it does not recurse) does the same for one model (the ``api`` variant).
"""

from harness.spec import Expect, PublicApi, Scenario, grads_scaled
from scenarios._models import MLP, randn_batch

FORCE_SUM_API = PublicApi(name="FSDPModule.set_force_sum_reduction_for_comms", since="2.8", replaces=("gloo_reduce_scatter_avg",),
                          reference_quirks=False,
                          configure=lambda module, dp_world: module.set_force_sum_reduction_for_comms(True))

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    world_sizes=(2, 4),
    devices=("cpu",),
    reference_quirks=False,
    api=FORCE_SUM_API,
    patches=("gloo_reduce_scatter_avg",),
    expect=(Expect(status="mismatch", torch="<2.9", variants=("vanilla",), devices=("cpu",),
                   upstream="pytorch/pytorch#162338", fixed_by="gloo_reduce_scatter_avg",
                   symptom=grads_scaled("world_size"),
                   why="gloo sums where FSDP2 asks for ReduceOp.AVG: grads come out world-size times too large"),),
)
