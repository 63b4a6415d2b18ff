"""L1: FSDP2's all-gather extension, one-argument pre-all-gather hook, on unevenly sharded weights.

Every 2-D weight of the MLP (13x7, 11x13, 3x11: 2 and 4 ranks leave short shards, and
one empty shard on 4) is a tensor subclass that defines ``fsdp_pre_all_gather(mesh)`` and
``fsdp_post_all_gather`` (``scenarios._ag_subclass.OneArgWeight``): its shard is
all-gathered as int32 bits and the unsharded weight is a view of the all-gather output.
The one-argument form gets no outer size and FSDP2 checks nothing, so the subclass pads
short shards itself from the row count it recorded (pytorch/ao#3982 is the same hook
without that padding; see ``l3_all_gather_ext_unpadded``). Grads and params must match
the plain model's reference.
"""

from harness.spec import Clip, Scenario, Sharding
from scenarios._ag_subclass import OneArgWeight, prepare_weights
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2"), prepare=prepare_weights(OneArgWeight)),
    clip=Clip(max_norm=0.05),
)
