"""L3: a one-argument all-gather extension that sends short shards unpadded (pytorch/ao#3982).

The weights of ``l1_all_gather_ext_one_arg`` with a pre-all-gather hook that returns
the local shard as it is (``scenarios._ag_subclass.UnpaddedWeight``), as torchao's
float8 weight did: fine on one rank and wherever shards are even, but with 2 or 4 ranks
the short ranks all-gather fewer elements than the others. The one-argument form gets no
outer size and FSDP2 checks nothing for it; the five-argument form (``l2``) gets
``outer_size`` and is checked. No patch: the fix is in the subclass.
"""

from harness.spec import GLOO_ABORT, HANG, Clip, Expect, Scenario, Sharding
from scenarios._ag_subclass import UnpaddedWeight, prepare_weights
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2"), prepare=prepare_weights(UnpaddedWeight)),
    clip=Clip(max_norm=0.05),
    timeout_s=20,
    expect=(Expect(status="crash", world_sizes=(2, 4), variants=("vanilla", "deployed"), devices=("cpu",),
                   match=GLOO_ABORT, upstream="pytorch/ao#3982",
                   why="the short ranks' all-gather inputs are smaller: gloo aborts on the sizes"),
            Expect(status="hang|error", world_sizes=(2, 4), variants=("vanilla", "deployed"), devices=("cuda",),
                   match={"hang": HANG, "error": "size"}, upstream="pytorch/ao#3982",
                   why="the short ranks' all-gather inputs are smaller"),),
)
