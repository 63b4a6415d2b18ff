"""HF Llama, tied embeddings, per-block units, bf16 params with fp32 reduce, 2 micro-batches."""

import torch

from harness.spec import Sharding, accumulate
from scenarios._hf import LLAMA_UNITS
from scenarios.hf_llama_tied import SCENARIO as TIED

SCENARIO = TIED.replace(
    sharding=Sharding(units=LLAMA_UNITS, param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(2),
)
