"""HF Llama with per-expert MoE where each rank uses one different expert of the same size: silent corruption.

Even ranks feed rows of token 2 (layer 0: expert 0), odd ranks token 6 (expert 2). The
reduce-scatters are of equal size, so gloo pairs expert 0's on one rank with expert 2's on
the other: no error, wrong grads. Only the comparison with the reference catches it.
"""

from harness.spec import HANG, Expect, differs_only
from scenarios import _hf
from scenarios.hf_moe_per_expert import SCENARIO as PER_EXPERT

SCENARIO = PER_EXPERT.replace(
    batch=_hf.rows_of(lambda ctx: (2, 2) if ctx.rank % 2 == 0 else (6, 6)),
    expect=(Expect(status="mismatch", devices=("cpu",), fixed_by="unused_param_reduction",
                   symptom=differs_only("model.layers.*.mlp.experts.*"),
                   why="equal-sized reduce-scatters of different experts are paired: no error, only the experts "
                       "differ"),
            Expect(status="hang|mismatch", devices=("cuda",), fixed_by="unused_param_reduction",
                   match={"hang": HANG, "mismatch": "experts"})),
)
