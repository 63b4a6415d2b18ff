"""F under HSDP: grad norm and clipping with CPU-offloaded grads over NCCL-only sub-groups.

As ``f_offload_clip_nccl_only``, on a ("replicate", "shard") mesh: the norm is reduced over
the shard groups, sub-groups of the world, and every group of the mesh serves only the
accelerator (on CPU: ``cuda:gloo`` groups of the same layout, ``Groups.norm_backend``). A
fix that falls back to a CPU-capable group must build it over the shard group's ranks: one
built over the world (or the replicate group) cannot run here, or sums the wrong partials.
"""

from harness.spec import Clip, Expect, Groups, Scenario, Sharding
from scenarios._hsdp_usage import GLOO_NO_AVG
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), offload=True, replicate=2),
    clip=Clip(max_norm=0.05),
    groups=Groups(norm_backend={"cpu": "cuda:gloo"}, backend={"cuda": "nccl"}),
    world_sizes=(4,),
    patches=("clip_grad_norm",),
    timeout_s=20,
    expect=(GLOO_NO_AVG, Expect(status="error", match="No backend type associated with device type cpu", fixed_by="clip_grad_norm"),),
)
