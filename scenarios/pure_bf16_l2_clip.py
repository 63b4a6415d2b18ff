"""Pure bf16 training clipped by the 2-norm: the total norm accumulated in fp32.

``pure_bf16``'s recipe (parameters stored in bf16, no MixedPrecisionPolicy, grads scaled by
1/3) clipped by the 2-norm of the bf16 grads. The reference accumulates the norm in fp32 and
rounds it once to bf16, as the patches' ``clip_grad_norm`` does; torch's own rounds each
parameter's norm to bf16 before combining them, one ulp away where the rounding falls
differently (the comparison allows a bf16 norm that one ulp). A norm accumulated in bf16 is off by several ulps and
shows in the norm and in every clipped grad.
"""

import torch

from harness.spec import Clip
from scenarios.pure_bf16 import pure_low_precision

SCENARIO = pure_low_precision(torch.bfloat16).replace(
    clip=Clip(max_norm=0.01, norm_type=2.0),
    patches=("clip_grad_norm", "scale_grads"),
)
