"""N under HSDP: a model built on the meta device and sharded on a ("replicate", "shard") mesh.

Each parameter is ``Replicate`` on the first mesh dim and ``Shard(0)`` on the second. On
CPU every rank draws its shard from the start of the same random stream (pytorch/pytorch#180088),
so with 2 x 2 ranks the shards repeat each other as in ``n_meta_init_sharded_rng``; with 2 x 1
the shard is the whole tensor and the init is right. A fix must see the ``Shard`` on whichever
mesh dim it is: one that reads the first dim only leaves HSDP's shards drawn per rank.
"""

from harness.spec import Expect, Scenario, Sharding, differs_only
from scenarios._hsdp_usage import GLOO_NO_AVG
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(init="meta", replicate=2),
    world_sizes=(2, 4),
    devices=("cpu",),
    patches=("meta_init_full_rng",),
    expect=(GLOO_NO_AVG,
            Expect(status="mismatch", variants=("vanilla",), devices=("cpu",), world_sizes=(4,),
                   upstream="pytorch/pytorch#180088", fixed_by="meta_init_full_rng",
                   symptom=differs_only("layers.*", kinds=("grad",)),
                   why="each rank fills its shard from the start of the same random stream: shards repeat"),),
)
