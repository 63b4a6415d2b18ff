"""K3: K2's trainable storage mix (bf16 experts, an fp32 router) under a compute dtype.

With ``MixedPrecisionPolicy(param_dtype=bf16)`` every parameter computes in bf16, but FSDP2's
uniform-dtype check is about the *stored* dtypes: every release from 2.7 to 2.15 still raises
"FSDP expects uniform original parameter dtype". So a fix must split units by storage dtype:
one that reasons from the compute dtype ("with param_dtype set, the unit computes in one
dtype") leaves the unit mixed here, and only here (K1 and K2 set no compute dtype).
"""

import torch

from harness.spec import Expect, Scenario, Sharding
from scenarios._dtype_mix import BF16, RoutedExperts
from scenarios._models import randn_batch


class CastingExperts(RoutedExperts):
    """K2's layout (two bf16 experts and an fp32 router under ``moe``, a bf16 ``out``), each layer
    computing in its weight's dtype: under a ``param_dtype`` every layer computes in that."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router = self.moe.router
        weights = torch.softmax(router(x.to(router.weight.dtype)).float(), dim=-1)
        mixed = sum(weights[:, i:i + 1] * e(x.to(e.weight.dtype)).float() for i, e in enumerate(self.moe.experts))
        return self.out(mixed.to(self.out.weight.dtype)).float()


SCENARIO = Scenario(
    model=CastingExperts,
    batch=randn_batch(),
    sharding=Sharding(param_dtype=BF16, reduce_dtype=torch.float32),
    world_sizes=(2,),  # K2 covers the other world sizes; the compute dtype is what this one adds
    patches=("shard_by_dtype",),
    expect=(Expect(status="error", match="uniform original parameter dtype", fixed_by="shard_by_dtype",
                   why="the check is on the stored dtypes, whatever the compute dtype"),),
)
