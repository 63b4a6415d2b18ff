"""F: grad norm and clipping with CPU-offloaded grads over a group with no CPU backend.

With ``CPUOffloadPolicy`` the sharded grads' local tensors live on the host while their
mesh's group is NCCL-only: torch's ``clip_grad_norm_`` all-reduces a CPU scalar over it,
"No backend type associated with device type cpu". On CPU the NCCL-only group is
simulated by a ``cuda:gloo`` group (``Groups.norm_backend``). Fixed by computing
the norm where the grads live and reducing the scalar on a device the group serves.
"""

from harness.spec import Clip, Expect, Groups, Scenario, Sharding
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0",), offload=True),
    clip=Clip(max_norm=0.05),
    groups=Groups(norm_backend={"cpu": "cuda:gloo"}, backend={"cuda": "nccl"}),
    patches=("clip_grad_norm",),
    timeout_s=20,
    expect=(
        Expect(status="error", world_sizes=(2, 4), match="No backend type associated with device type cpu",
               fixed_by="clip_grad_norm"),
        Expect(status="error", world_sizes=(1,), torch="<2.10", match="No backend type associated with device type cpu",
               fixed_by="clip_grad_norm", why="before 2.10 the norm is all-reduced even over a one-rank mesh"),
        Expect(status="pass", world_sizes=(1,), why="since 2.10 a one-rank mesh needs no all-reduce of the norm"),
    ),
)
