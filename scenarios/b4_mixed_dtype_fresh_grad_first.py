"""B4: as B2, with the parameter whose grad is fresh registered before the accumulated one.

``late`` (used only in the last, syncing micro-batch) comes first in the unit, so the
reduce-scatter group FSDP2 builds starts with its fresh bf16 grad and then meets ``used``'s
fp32 accumulated grad: the same "uniform gradient dtype" assertion as B2. A fix must widen
the group to the promoted dtype (fp32), whichever grad comes first: one that takes the first
grad's dtype reduces ``used`` in bf16 here, and only here.
"""

from torch import nn

from harness.spec import Expect, Scenario, accumulate, mean_square
from scenarios._mixed import sharding
from scenarios._models import IN, randn_batch


class LateFirst(nn.Module):
    """``late`` registered first, ``used`` second; ``late`` runs only when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(IN, IN)
        self.used = nn.Linear(IN, IN)

    def forward(self, x, use_late: bool = False):
        y = self.used(x)
        return self.late(y) if use_late else y


def forward(model, x, ctx):
    return mean_square(model(x, use_late=ctx.micro_batch == 1))


SCENARIO = Scenario(
    model=LateFirst,
    batch=randn_batch(),
    forward=forward,
    sharding=sharding(api=False),
    schedule=accumulate(2),
    world_sizes=(1, 2),  # the order of the group is what matters, not its size
    patches=("uniform_reduce_dtype",),
    expect=(Expect(status="error", torch="<2.15", match="uniform gradient dtype", fixed_by="uniform_reduce_dtype"),),
)
