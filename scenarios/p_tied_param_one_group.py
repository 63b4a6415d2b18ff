"""P, as stacks avoid it: the tied embedding and head sharded as one group.

``fully_shard([emb, head])`` (the unit ``"emb+head"``), then the root: the tie holds and every
value matches the single-process run (``p_tied_param_two_groups`` is the bug).
"""

from harness.spec import Scenario, Sharding, mean_square
from scenarios.p_tied_param_two_groups import TiedLM, tokens

SCENARIO = Scenario(
    model=TiedLM,
    batch=tokens,
    forward=lambda model, batch, ctx: mean_square(model(batch)),
    sharding=Sharding(units=("emb+head",)),
    steps=1,
)
