"""HF Mixtral (transformers 5): experts stacked into 3-D parameters, so routing leaves no parameter without grad.

Each rank feeds rows of one repeated token, so the ranks route to different experts; an
expert without tokens only has zero rows in the stacked grad. Bug A should not arise;
this shows whether that holds under FSDP2.
"""

from harness.spec import Scenario, Sharding
from scenarios import _hf

SCENARIO = Scenario(
    model=_hf.mixtral,
    batch=_hf.rows_of(lambda ctx: (3 + ctx.rank, 40 + 7 * ctx.rank)),
    forward=_hf.lm_loss,
    optimizer=_hf.SGD,
    sharding=Sharding(units=_hf.LLAMA_UNITS),
    requires=_hf.REQUIRES,
)
