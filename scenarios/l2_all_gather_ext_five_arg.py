"""L2: FSDP2's all-gather extension, five-argument pre-all-gather hook, uneven shards, bf16 params / fp32 reduce.

The MLP's 2-D weights (13x7, 11x13, 3x11: short shards on 2 and 4 ranks, one empty on
4) are a tensor subclass whose ``fsdp_pre_all_gather(mesh, outer_size, outer_stride,
module, mp_policy)`` pads the shard to ``ceil(outer_size[0] / ranks)`` rows (FSDP2 checks
that size on the short ranks) and casts it to ``mp_policy.param_dtype`` itself, which
FSDP2 leaves to the extension (``scenarios._ag_subclass.FiveArgWeight``); the biases take
FSDP2's own path. Grads (reduced in fp32) and params must match the reference's bf16
emulation.
"""

import torch

from harness.spec import Clip, Scenario, Sharding
from scenarios._ag_subclass import FiveArgWeight, prepare_weights
from scenarios._models import MLP, randn_batch

SCENARIO = Scenario(
    model=MLP,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2"), prepare=prepare_weights(FiveArgWeight),
                      param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    clip=Clip(max_norm=0.05),
)
