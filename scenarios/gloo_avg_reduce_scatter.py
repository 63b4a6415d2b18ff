"""Upstream bug: before torch 2.9 gloo computes FSDP2's AVG reduce-scatter as a sum (pytorch/pytorch#162338).

A silent-correctness bug: on CPU, torch 2.7 and 2.8 give grads shard-size times too large.
Every other scenario's reference models the sum on those versions, so that they can judge
the patches (their records and the report name that adjustment); this one judges
against the true mean, so the bug itself is reported. No patch fixes it.
"""

from harness.spec import Expect, Scenario
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    world_sizes=(2, 4),
    devices=("cpu",),
    reference_quirks=False,
    expect=(Expect(status="mismatch", torch="<2.9", variants=("vanilla", "deployed"), devices=("cpu",),
                   upstream="pytorch/pytorch#162338",
                   why="gloo sums where FSDP2 asks for ReduceOp.AVG: grads come out world-size times too large"),),
)
