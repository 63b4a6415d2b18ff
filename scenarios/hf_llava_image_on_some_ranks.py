"""HF LLaVA where only rank 0 has an image: the tower's units run forward on some ranks only.

The ranks then issue different all-gathers (gloo aborts on the size mismatch). No patch
can fix this; it is a documented expected failure of every variant.
"""

from harness.spec import GLOO_ABORT, HANG, Expect
from scenarios import _hf
from scenarios.hf_llava_text_only_micro_batch import SCENARIO as LLAVA

SCENARIO = LLAVA.replace(
    batch=_hf.llava_batch(with_image=lambda ctx: ctx.rank == 0),
    schedule=LLAVA.schedule[1:],
    sharding=LLAVA.sharding.__class__(units=_hf.LLAVA_UNITS),
    world_sizes=(2,),
    timeout_s=10,
    expect=(Expect(status="crash", variants=("vanilla", "patched"), devices=("cpu",), match=GLOO_ABORT,
                   why="the ranks issue different all-gathers (gloo aborts on the sizes): no patch can fix this"),
            Expect(status="hang", variants=("vanilla", "patched"), devices=("cuda",), match=HANG,
                   why="the ranks issue different all-gathers: no patch can fix this"),),
)
