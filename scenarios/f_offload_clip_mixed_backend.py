"""F with a ``cpu:gloo,cuda:nccl`` group: the CPU backend hides the offloaded-norm bug.

Vanilla passes here; kept beside the NCCL-only case so a report shows that a mixed group
is a workaround, not a fix. CUDA only.
"""

from harness.spec import Clip, Groups, Scenario, Sharding
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), offload=True),
    clip=Clip(max_norm=0.05),
    groups=Groups(backend={"cuda": "cpu:gloo,cuda:nccl"}),
    devices=("cuda",),
    patches=("clip_grad_norm",),
)
