"""Pure fp16 training: parameters stored in fp16, no MixedPrecisionPolicy, clipping and grad scaling.

``pure_bf16``'s recipe in fp16, where FSDP2 divides the grads by a factor before and
after the sum (fp16 overflows: no AVG reduction). With two ranks the division by 2 is
exact and the sum rounds once, as in the reference. The step is SGD with momentum:
AdamW's default eps (1e-8) is zero in fp16, so a grad element whose square underflows
gets a 0/0 update (the reference itself turns non-finite; a property of pure fp16 with
AdamW, not of FSDP2).
"""

import torch

from harness.spec import Optim
from scenarios.pure_bf16 import pure_low_precision

SCENARIO = pure_low_precision(torch.float16, Optim(kind="sgd"))
