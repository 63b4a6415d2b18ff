"""S: a parameter's ``grad_dtype`` is dropped by ``fully_shard``: bf16 grads where fp32 were asked.

torch 2.10 added ``Tensor.grad_dtype``: a bf16 parameter whose grads accumulate in fp32 (stacks
keep bf16 weights with fp32 grads this way instead of an fp32 master copy). ``fully_shard``
replaces each parameter by a new sharded one and does not carry ``grad_dtype`` over, so the
grads come out bf16 (pytorch/pytorch#170648; measured: bf16 on 2.10 .. 2.14, fp32 on 2.15).
With one rank the values still match and the ``GradDtype`` check names the dtype; with two
the bf16 reduction's rounding shows in the grads. No stack patches it: an upstream-bug row. Skipped before 2.10, where torch has no ``grad_dtype``.
"""

import torch

from harness.spec import Expect, Optim, Scenario, Sharding, differs_only, mean_square
from harness.train.checks import GradDtype
from harness.train.hooks import NeedsTorch
from scenarios._models import MLP, randn_batch

UPSTREAM = "pytorch/pytorch#170648"


def bf16_with_fp32_grads() -> torch.nn.Module:
    model = MLP().to(torch.bfloat16)
    for p in model.parameters():
        p.grad_dtype = torch.float32
    return model


SCENARIO = Scenario(
    model=bf16_with_fp32_grads,
    batch=randn_batch(),
    forward=lambda model, x, ctx: mean_square(model(x.to(torch.bfloat16))),
    sharding=Sharding(units=("layers.0", "layers.1", "layers.2")),
    optimizer=Optim(kind="sgd"),
    world_sizes=(1, 2),
    checks=(GradDtype(torch.float32),),
    hooks=(NeedsTorch("Tensor.grad_dtype", since="2.10"),),
    expect=(
        Expect(status="mismatch", torch="<2.15", variants=("vanilla", "deployed"), world_sizes=(1,),
               match="grad dtype: ", upstream=UPSTREAM,
               why="fully_shard makes new sharded parameters without the original's grad_dtype: bf16 grads"),
        Expect(status="mismatch", torch="<2.15", variants=("vanilla", "deployed"), world_sizes=(2,),
               symptom=differs_only("*", kinds=("grad",)), upstream=UPSTREAM,
               why="the dropped grad_dtype: grads reduced and kept in bf16 differ from fp32 grads by bf16 rounding"),
    ),
)
