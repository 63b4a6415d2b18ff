"""C: a separately wrapped unit (``vision``) never runs forward, under a no-sync micro-batch.

The root's final callback runs ``post_backward`` for ``vision`` too, whose
``to_accumulated_grad_if_needed`` reads ``_unsharded_param`` that was never created:
AttributeError (also at world size 1). Fixed by a guard for exactly that case.
"""

import torch
from torch import nn

from harness.spec import Expect, Scenario, Sharding, accumulate
from scenarios._models import randn_batch


class VisionText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision = nn.Linear(7, 7)
        self.text = nn.Linear(7, 7)

    def forward(self, x: torch.Tensor, with_image: bool = False) -> torch.Tensor:
        return self.text(self.vision(x) if with_image else x)


SCENARIO = Scenario(
    model=VisionText,
    batch=randn_batch(),
    sharding=Sharding(units=("vision",), param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    schedule=accumulate(2),
    patches=("accumulated_grad_guard",),
    expect=(Expect(status="error", torch="<2.15", match="_unsharded_param", fixed_by="accumulated_grad_guard"),),
)
