"""HF Llama with its first decoder block under ``torch.compile`` (backend aot_eager), then sharded.

Inductor is left out: compiling one tiny block takes 20-30 s on this 2-core CPU (measured on
2.7.1, 2.13.0 and 2.15.0), against about 1-4 s for aot_eager, which still traces forward and
backward through dynamo and AOTAutograd with FSDP2's hooks around the block. The reference
runs the block eagerly: compiling must not change the numbers.
"""

from harness.spec import Scenario, Sharding
from scenarios import _hf


def compile_first_block(model):
    model.model.layers[0].compile(backend="aot_eager")


SCENARIO = Scenario(
    model=_hf.llama,
    batch=_hf.text_batch(_hf.LLAMA["vocab_size"]),
    forward=_hf.lm_loss,
    sharding=Sharding(units=_hf.LLAMA_UNITS, prepare=compile_first_block),
    world_sizes=(1, 2),
    timeout_s=120,
    requires=_hf.REQUIRES,
)
