"""K2: a trainable dtype mix in one FSDP unit (bf16 experts with an fp32 router).

Every release from 2.7 to 2.15 raises "FSDP expects uniform original parameter dtype" at
the first forward: one unit's trainable parameters must share a dtype. Fixed by sharding
each dtype as its own unit (``shard_by_dtype``: ``moe.router`` becomes an fp32 unit). The
2.15 ``MixedPrecisionPolicy.param_dtype_override_fn`` covers the compute dtypes only: one
unit still needs one storage dtype, so the bf16 weights are stored and stepped in fp32
(computing in bf16). Each step then agrees with the bf16 model within bf16 precision
(measured on 2.15.0, world sizes 1, 2 and 4: grads up to 3.7e-3 of their scale, under one
bf16 ulp), so the API replaces the split where fp32 master weights are acceptable; it costs
fp32 storage for the experts. Grads are reduced in fp32 (``reduce_dtype``), as
mixed-precision stacks do: a bf16 reduction over 4 ranks rounds at every addition, and
AdamW turns those roundings into parameter differences that the fp32 router's grads then
show.
"""

import torch

from harness.spec import Expect, Scenario, Sharding
from scenarios._dtype_mix import OVERRIDE_API, RoutedExperts
from scenarios._models import randn_batch

SCENARIO = Scenario(
    model=RoutedExperts,
    batch=randn_batch(),
    sharding=Sharding(reduce_dtype=torch.float32),
    patches=("shard_by_dtype",),
    api=OVERRIDE_API,
    expect=(Expect(status="error", match="uniform original parameter dtype", fixed_by="shard_by_dtype",
                   why="one unit's trainable parameters must share a dtype"),),
)
