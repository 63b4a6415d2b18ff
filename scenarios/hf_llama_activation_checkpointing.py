"""HF Llama with activation checkpointing on the decoder blocks (non-reentrant), one unit per block.

transformers' own ``gradient_checkpointing_enable`` recomputes each block's forward in
backward (and turns the KV cache off); grads must equal the run without checkpointing.
"""

from harness.spec import Scenario, Sharding
from scenarios import _hf


def checkpointed_llama():
    model = _hf.llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


SCENARIO = Scenario(
    model=checkpointed_llama,
    batch=_hf.text_batch(_hf.LLAMA["vocab_size"]),
    forward=_hf.lm_loss,
    sharding=Sharding(units=_hf.LLAMA_UNITS),
    requires=_hf.REQUIRES,
)
