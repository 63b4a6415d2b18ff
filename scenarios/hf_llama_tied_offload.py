"""HF Llama, tied embeddings, per-block units, with CPU offload of params and grads."""

from harness.spec import Sharding
from scenarios._hf import LLAMA_UNITS
from scenarios.hf_llama_tied import SCENARIO as TIED

SCENARIO = TIED.replace(sharding=Sharding(units=LLAMA_UNITS, offload=True))
