"""HF dense decoder (Llama) with tied input/output embeddings, one FSDP unit per decoder block, fp32.

The tied weight lives in the root unit, so it stays one parameter with one grad.
"""

from harness.spec import Scenario, Sharding
from scenarios import _hf

SCENARIO = Scenario(
    model=_hf.llama,
    batch=_hf.text_batch(_hf.LLAMA["vocab_size"]),
    forward=_hf.lm_loss,
    sharding=Sharding(units=_hf.LLAMA_UNITS),
    requires=_hf.REQUIRES,
)
