"""Upstream bug: random init of a model built on the meta device and sharded draws each shard
from its own generator (pytorch/pytorch#180088, pytorch/torchtitan#3106).

Large-model stacks build under ``torch.device("meta")``, ``fully_shard``, ``to_empty`` on
the device, then call ``reset_parameters()``. ``Sharding(init="meta")`` does exactly that
under ``MODEL_SEED``; the reference builds the full model under the same seed. On CPU
DTensor has no random-number tracker, so every rank fills its shard from the start of the
same random stream (rank 1's rows repeat rank 0's) and advances its generator by its shard's
size only, so every later parameter is shifted too. The init is not compared itself: the
step-0 grads are computed from it, so a wrong init shows there (and in every later step).
At world size 1 the shard is the whole tensor and the init is right.

``meta_init_full_rng`` (``fsdp_patches.meta_init``) makes ``DTensor.uniform_``/``normal_``
draw the full tensor on every rank and keep this rank's slice (the ``to_local()`` approach
proposed for torchtitan). Measured on CPU/gloo, torch 2.7 .. 2.15. On CUDA DTensor's offset-based
tracker makes shards slices of one CUDA random stream, which still is not the reference's
init: measured on an H200 (torch 2.11) at world size 1 through ``run --init meta``, every
vanilla cell differs at its step-0 params (``plain``: max |diff| 0.53) and every cell with
``meta_init_full_rng`` passes. CUDA expectations are not declared here (one GPU measured).
"""

from harness.spec import Expect, Scenario, Sharding, differs_only
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(init="meta"),
    world_sizes=(1, 2, 4),
    devices=("cpu",),
    patches=("meta_init_full_rng",),
    expect=(Expect(status="mismatch", variants=("vanilla",), devices=("cpu",), world_sizes=(2, 4),
                   upstream="pytorch/pytorch#180088", fixed_by="meta_init_full_rng",
                   symptom=differs_only("layers.*", kinds=("grad",)),
                   why="each rank fills its shard from the start of the same random stream: shards repeat "
                       "each other instead of slicing one full init"),),
)
