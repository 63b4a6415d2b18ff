"""HF vision-language model (LLaVA, CLIP tower): a text-only micro-batch skips the vision tower under accumulation.

Bug C in its natural form: micro-batch 0 (no gradient sync) is text only, so the tower's
units never run forward; with bf16 params / fp32 reduce the root's final backward callback
still reaches them: "'FSDPParam' object has no attribute '_unsharded_param'" (torch < 2.15).
Micro-batch 1 carries an image, so the tower trains in the same window. Once C is fixed, B
follows in the root unit: the vision embeddings get fresh bf16 grads in micro-batch 1 beside
the text params' fp32 grads accumulated since micro-batch 0, so a training stack needs both.
"""

import torch

from harness.spec import Expect, Scenario, Sharding, accumulate
from scenarios import _hf

SCENARIO = Scenario(
    model=_hf.llava,
    batch=_hf.llava_batch(with_image=lambda ctx: ctx.micro_batch == 1),
    forward=_hf.lm_loss,
    sharding=Sharding(units=_hf.LLAVA_UNITS, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(2),
    patches=("accumulated_grad_guard", "uniform_reduce_dtype"),
    requires=_hf.REQUIRES,
    expect=(Expect(status="error", torch="<2.15", match="_unsharded_param", fixed_by="accumulated_grad_guard"),),
)
