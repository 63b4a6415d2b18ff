"""C, the variant no patch fixes: the wrapped vision tower is skipped on odd ranks only.

The ranks then disagree on the forward all-gathers of a separately wrapped unit: a hang
(or, on gloo, unrelated all-gathers of equal size paired up). Kept as a documented
expected failure for both variants.
"""

import torch

from harness.spec import Expect, Scenario, Sharding, accumulate
from scenarios.c_skipped_vision_tower import VisionText

_FAILS = "error|hang|crash|mismatch"

SCENARIO = Scenario(
    name="c_vision_skipped_some_ranks",
    summary="C (expected failure): vision tower skipped on odd ranks only",
    model=VisionText,
    batch=lambda ctx: torch.randn(5, 7),
    forward=lambda model, x, ctx: model(x, with_image=ctx.rank % 2 == 0).float().square().mean(),
    sharding=Sharding(units=("vision",), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(2),
    world_sizes=(2,),
    patches=("accumulated_grad_guard",),
    timeout_s=10,
    expect=(
        Expect(status=_FAILS, why="forward all-gathers desync: no patch can fix this"),
        Expect(status=_FAILS, variant="patched", why="forward all-gathers desync: no patch can fix this"),
    ),
)
