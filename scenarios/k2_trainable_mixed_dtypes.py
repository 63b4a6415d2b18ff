"""K2: a trainable dtype mix in one FSDP unit (bf16 experts with an fp32 router).

Every release from 2.7 to 2.15 raises "FSDP expects uniform original parameter dtype" at
the first forward: one unit's trainable parameters must share a dtype. Fixed by sharding
each dtype as its own unit (``shard_by_dtype``: ``moe.router`` becomes an fp32 unit). The
2.15 ``MixedPrecisionPolicy.param_dtype_override_fn`` covers the compute dtypes only: one
unit still needs one storage dtype, so the bf16 weights are stored and stepped in fp32
(computing in bf16). Step 0 agrees with the bf16-stored model; from step 1 the fp32
master weights move it away (measured on 2.15.0, world sizes 1, 2 and 4: grads up to
3e-3 apart, beyond fp32 tolerance for the router), so the API does not replace the split
here. Grads are reduced in fp32 (``reduce_dtype``), as mixed-precision stacks do: a bf16
reduction over 4 ranks rounds at every addition, and AdamW turns those roundings into
parameter differences that the fp32 router's grads then show.
"""

import torch

from harness.spec import Expect, Scenario, Sharding, from_step
from scenarios._dtype_mix import OVERRIDE_API, RoutedExperts
from scenarios._models import randn_batch

SCENARIO = Scenario(
    model=RoutedExperts,
    batch=randn_batch(),
    sharding=Sharding(reduce_dtype=torch.float32),
    patches=("shard_by_dtype",),
    api=OVERRIDE_API,
    expect=(Expect(status="error", match="uniform original parameter dtype", fixed_by="shard_by_dtype",
                   why="one unit's trainable parameters must share a dtype"),
            Expect(status="mismatch", torch=">=2.15", variants=("api",), symptom=from_step(1),
                   why="the API route stores the bf16 weights in fp32: fp32 master weights, so training departs "
                       "from the bf16-stored model from step 1"),),
)
