"""HF Llama on a 2-D mesh: tensor parallel over "tp" (attention and MLP), FSDP2 over "dp", world size 4.

Colwise q/k/v and gate/up, rowwise o and down (DTensor on gloo); then ``fully_shard`` per
block and the root over the "dp" dim. The two ranks of a "dp" index see the same data. The
MLP width (56) divides by tp x dp: uneven dims fail on 2.7 ("FSDP+TP sharding does not
support uneven sharding") and read back wrong on 2.8/2.9.
"""

from harness.spec import Scenario, Sharding
from scenarios import _hf


def tensor_parallel(model, tp_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


SCENARIO = Scenario(
    model=lambda: _hf.llama(intermediate_size=56),
    batch=_hf.text_batch(_hf.LLAMA["vocab_size"]),
    forward=_hf.lm_loss,
    optimizer=_hf.SGD,  # AdamW turns the tensor-parallel reductions' rounding noise into ~1e-5 param differences
    sharding=Sharding(units=_hf.LLAMA_UNITS, tp=2, tp_plan=tensor_parallel),
    world_sizes=(4,),
    requires=_hf.REQUIRES,
)
