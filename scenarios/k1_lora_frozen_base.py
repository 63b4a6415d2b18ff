"""K1: LoRA, a frozen bf16 base and trainable fp32 adapters in one FSDP unit.

torch 2.7 checks every parameter of a unit for one dtype at lazy init and raises "FSDP
expects uniform original parameter dtype" although the odd dtype is frozen; 2.8 .. 2.15
check the trainable parameters only, so the mix trains. Fixed by sharding each dtype as
its own unit (``shard_by_dtype``: the adapters of a layer become one fp32 unit), as
stacks do (NVIDIA-NeMo/Automodel#2655); others cast the base to fp32
(huggingface/accelerate#3985), which the 2.15 ``param_dtype_override_fn`` makes exact.
"""

from harness.spec import Expect, Scenario, Sharding
from scenarios._dtype_mix import OVERRIDE_API, LoraNet
from scenarios._models import randn_batch

SCENARIO = Scenario(
    model=LoraNet,
    batch=randn_batch(),
    sharding=Sharding(units=("layers.0", "layers.1")),
    patches=("shard_by_dtype",),
    api=OVERRIDE_API,
    expect=(Expect(status="error", torch="<2.8", match="uniform original parameter dtype", fixed_by="shard_by_dtype",
                   why="2.7 counts the frozen bf16 base in the unit's dtype check"),),
)
