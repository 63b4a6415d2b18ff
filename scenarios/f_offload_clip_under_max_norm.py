"""F with clipping that does not trigger: the norm stays under max_norm, so grads must come back unchanged.

The same NCCL-only offloaded recipe as ``f_offload_clip_nccl_only``, with ``max_norm=10``
(the grad norms are near 0.2): a clip coefficient that is not clamped to 1 scales the
grads up, which only a scenario like this one can see.
"""

from harness.spec import Clip
from scenarios.f_offload_clip_nccl_only import SCENARIO as CLIPPING

SCENARIO = CLIPPING.replace(clip=Clip(max_norm=10.0))
