"""HF Llama with per-expert MoE blocks: routing leaves experts without tokens on some ranks (A) and on every rank (E).

Even ranks feed rows of tokens 2 and 52, odd ranks 6 and 9 (one token per row, so top-1
sends a row to one expert): in layer 0, experts 0 and 1 run on even ranks only, expert 2
on odd ranks only, expert 3 nowhere. Vanilla FSDP2 reduce-scatters different sets on
different ranks: gloo aborts. With unused-param reduction (patch, or the public API), the
experts no rank used must still end with no grad (E's patch).
"""

from harness.spec import HANG, UNUSED_PARAMS_API, Expect, Scenario, Sharding
from scenarios import _hf

SCENARIO = Scenario(
    model=_hf.llama_moe,
    batch=_hf.rows_of(lambda ctx: _hf.MOE_TOKENS["even" if ctx.rank % 2 == 0 else "odd"]),
    forward=_hf.lm_loss,
    optimizer=_hf.SGD,
    sharding=Sharding(units=_hf.LLAMA_UNITS),
    world_sizes=(2, 4),
    patches=("unused_param_reduction", "restore_unused_param_grads"),
    api=UNUSED_PARAMS_API,
    timeout_s=30,
    requires=_hf.REQUIRES,
    expect=(Expect(status="crash", devices=("cpu",), match="enforce fail",
                   fixed_by="unused_param_reduction", why="gloo aborts: ranks reduce-scatter different sizes"),
            Expect(status="hang|mismatch", devices=("cuda",), fixed_by="unused_param_reduction",
                   match={"hang": HANG, "mismatch": "experts"})),
)
