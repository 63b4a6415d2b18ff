import subprocess
import sys
import textwrap

import torch
from torch import nn

from harness.spec import MODEL_SEED, Ctx, Optim, Scenario, accumulate
from harness.train.reference import run_reference
from tests.support import ROOT


def _linear():
    return nn.Linear(3, 1, bias=False)


def _dot_loss(model, batch, ctx):
    return model(batch).sum()


def test_grad_is_sum_over_micro_batches_of_mean_over_ranks():
    s = Scenario(name="lin", summary="", model=_linear, batch=lambda ctx: torch.randn(2, 3), forward=_dot_loss,
                 schedule=accumulate(2), steps=1, optimizer=Optim(lr=0.0, weight_decay=0.0))
    world = 3
    snap = run_reference(s, world)[0]
    expected = torch.zeros(1, 3)
    for mb in range(2):
        for r in range(world):
            ctx = Ctx(rank=r, world_size=world, step=0, micro_batch=mb)
            torch.manual_seed(s.batch_seed(ctx))
            expected += s.batch(ctx).sum(0, keepdim=True) / world
    torch.testing.assert_close(snap.grads["weight"], expected)


class _TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


def test_a_parameter_no_rank_uses_has_no_grad_and_is_never_stepped():
    steps = run_reference(Scenario(name="u", model=_TwoBranch, batch=lambda ctx: torch.randn(2, 3)), 2)
    assert len(steps) == 3  # the default: set_to_none=False runs mid-training
    torch.manual_seed(0)
    initial = _TwoBranch().unused.weight.detach()
    for snap in steps:
        assert snap.grads["unused.weight"] is None and not snap.opt_state["unused.weight"]
        torch.testing.assert_close(snap.params["unused.weight"], initial, rtol=0, atol=0)
        assert snap.grads["used.weight"] is not None and snap.opt_state["used.weight"]


def test_rank_dependent_forward_sees_every_rank():
    def forward(model, batch, ctx):
        return model(batch).sum() * (ctx.rank + 1)

    s = Scenario(name="r", summary="", model=_linear, batch=lambda ctx: torch.ones(1, 3), forward=forward, steps=1)
    # ranks weigh 1 and 2: mean = 1.5 * ones
    torch.testing.assert_close(run_reference(s, 2)[0].grads["weight"], torch.full((1, 3), 1.5))


def test_reference_never_touches_torch_distributed():
    script = textwrap.dedent('''
        import torch.distributed as dist
        def forbidden(*a, **k):
            raise AssertionError("the reference called torch.distributed")
        for name in ["init_process_group", "new_group", "all_reduce", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter_tensor", "broadcast", "barrier", "all_gather_object"]:
            setattr(dist, name, forbidden)
        from harness.train.reference import run_reference
        from harness.scenario.load import load_scenarios
        n = 0
        for s in load_scenarios().scenarios.values():
            for ws in s.world_sizes:
                run_reference(s, ws)
                n += 1
        assert not dist.is_initialized()
        print("ran", n)
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 10


def test_gloo_quirk_before_2_9_is_modelled_per_mesh_and_recorded():
    from harness.spec import Sharding
    from harness.train.reference import GLOO_AVG_SUMS, quirks_for

    assert quirks_for(torch_version="2.8.0+cu128", backend="gloo") == [GLOO_AVG_SUMS]
    assert quirks_for(torch_version="2.9.1", backend="gloo") == []
    assert quirks_for(torch_version="2.8.0", backend="nccl") == []
    s = Scenario(name="q", summary="", model=_linear, batch=lambda ctx: torch.ones(1, 3), forward=_dot_loss, steps=1)
    mean = run_reference(s, 4)[0].grads["weight"]
    summed = run_reference(s, 4, quirks=[GLOO_AVG_SUMS])[0].grads["weight"]
    torch.testing.assert_close(summed, mean * 4)  # 1-D: the shard group sums
    hsdp = s.replace(sharding=Sharding(replicate=2), world_sizes=(2, 4))
    torch.testing.assert_close(run_reference(hsdp, 4, quirks=[GLOO_AVG_SUMS])[0].grads["weight"], mean * 2)


class _WithBuffer(nn.Module):
    """A float buffer used in forward, like rotary frequencies: FSDP2's mixed precision leaves it fp32."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.tensor([1.0 + 2**-12] * 3))

    def forward(self, x):
        return self.lin(x) * self.scale.float()


def test_bf16_emulation_casts_parameters_not_buffers():
    from harness.spec import Sharding

    s = Scenario(name="buf", model=_WithBuffer, batch=lambda ctx: torch.randn(2, 3), steps=1,
                 sharding=Sharding(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    (snap,) = run_reference(s, 1)
    torch.manual_seed(0)
    model = _WithBuffer()
    replica = _WithBuffer()
    replica.load_state_dict(model.state_dict())
    for p in replica.parameters():
        p.data = p.data.to(torch.bfloat16)
    torch.manual_seed(s.batch_seed(Ctx(rank=0, world_size=1, step=0, micro_batch=0)))
    x = s.batch(Ctx(rank=0, world_size=1, step=0, micro_batch=0)).to(torch.bfloat16)
    loss = replica(x).float().square().mean()
    (g,) = torch.autograd.grad(loss, [replica.lin.weight])
    torch.testing.assert_close(snap.grads["lin.weight"], g.float(), rtol=0, atol=0)
    assert replica.scale.dtype == torch.float32  # a bf16 buffer would round 1 + 2**-12 to 1


class _Tied(nn.Module):
    """A weight used twice in one forward (tied input/output embeddings)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 5)
        self.mid = nn.Linear(5, 5)

    def forward(self, x):
        return (self.mid(self.emb(x)) @ self.emb.weight.t()).float().pow(2).mean()


def test_per_use_upcast_from_2_15_is_modelled_for_the_first_no_sync_micro_batch():
    from harness.spec import Sharding
    from harness.train.reference import PER_USE_UPCAST, quirks_for

    mixed = Sharding(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert PER_USE_UPCAST in quirks_for(torch_version="2.15.0", backend="gloo", sharding=mixed)
    assert PER_USE_UPCAST not in quirks_for(torch_version="2.14.1+cu130", backend="gloo", sharding=mixed)
    assert quirks_for(torch_version="2.15.0", backend="gloo", sharding=Sharding()) == []

    batches = [torch.randint(0, 11, (3, 4)) for _ in range(2)]
    s = Scenario(name="tied", summary="", model=_Tied, batch=lambda ctx: batches[ctx.micro_batch],
                 forward=lambda m, x, ctx: m(x), sharding=mixed, schedule=accumulate(2), steps=1,
                 optimizer=Optim(lr=0.0, weight_decay=0.0))
    with_quirk = run_reference(s, 1, quirks=[PER_USE_UPCAST])[0].grads["emb.weight"]
    without = run_reference(s, 1)[0].grads["emb.weight"]

    torch.manual_seed(MODEL_SEED)
    base = _Tied().to(torch.bfloat16)

    def uses(x):  # each use's gradient, in bf16
        w_in = base.emb.weight.detach().clone().requires_grad_()
        w_out = base.emb.weight.detach().clone().requires_grad_()
        loss = (base.mid(nn.functional.embedding(x, w_in)) @ w_out.t()).float().pow(2).mean()
        return torch.autograd.grad(loss, [w_in, w_out])

    (a_in, a_out), (b_in, b_out) = uses(batches[0]), uses(batches[1])
    # micro-batch 0 (no sync, no grad yet): each use upcast, then added; micro-batch 1: summed in bf16
    assert torch.equal(with_quirk, (a_in.float() + a_out.float()) + (b_in + b_out).float())
    assert torch.equal(without, (a_in + a_out).float() + (b_in + b_out).float())
    assert not torch.equal(with_quirk, without)


def _clip_faults(max_norm: float, dtype: torch.dtype) -> dict[str, set[str]]:
    """The kinds of diff each clip fault shows, judged one step from 'FSDP2' tensors that are
    the reference's own, then tampered with."""
    import copy
    import math

    from harness.spec import Clip, mean_square
    from harness.train.compare import compare_runs
    from scenarios._models import MLP, randn_batch

    s = Scenario(model=lambda: MLP().to(dtype), batch=randn_batch(), steps=1,
                 forward=lambda model, x, ctx: mean_square(model(x.to(dtype))),
                 clip=Clip(max_norm=max_norm, norm_type=2.0), world_sizes=(2,))
    own = run_reference(s, 2)
    assert own[0].grad_norm > 2 * max_norm  # the clip acts

    def faulted(norm_factor: float, coef_factor: float):
        observed = copy.deepcopy(own)
        snap = observed[0]
        snap.grad_norm = own[0].grad_norm * norm_factor
        coef = max_norm / (snap.grad_norm + 1e-6) * coef_factor
        snap.clipped = {n: None if g is None else (g.double() * coef).to(dtype) for n, g in snap.grads.items()}
        return observed

    kinds = {}
    for name, (norm_factor, coef_factor) in {"none": (1, 1), "norm": (2, 1), "scale": (1, 0.5)}.items():
        observed = faulted(norm_factor, coef_factor)
        result = compare_runs(observed, run_reference(s, 2, observed=observed))
        # the tampered clipped grads were not stepped with here, so post-step params are not looked at
        kinds[name] = {d.kind for d in result.diffs if not d.ok and d.kind != "param"}
        assert math.isfinite(result.ref_grad_norm)
    return kinds


def test_the_clip_is_judged_as_one_operation_from_fsdps_grads_and_its_norm():
    """The reference clips the grads FSDP2 clipped by the norm FSDP2's clip returned: a wrong
    norm shows in the norm alone (clipped by it, the grads are what that norm makes), a wrong
    scale in the clipped grads alone; the grads before the clip agree in both."""
    assert _clip_faults(0.05, torch.float32) == {"none": set(), "norm": {"grad_norm"}, "scale": {"clipped"}}


def test_the_clip_of_bf16_grads_is_judged_the_same_way():
    assert _clip_faults(0.01, torch.bfloat16) == {"none": set(), "norm": {"grad_norm"}, "scale": {"clipped"}}


def test_a_cpu_batch_is_seeded_as_torch_manual_seed_seeds_it_without_queuing_accelerator_seeds(monkeypatch):
    """Both sides seed each batch with ``recipe.seed_batch``: on CPU the CPU generator alone, drawing
    what ``torch.manual_seed`` would give; elsewhere ``torch.manual_seed`` itself (every device's generator)."""
    from harness.train import recipe

    torch.manual_seed(11)
    expected = torch.randn(4, 3)
    torch.manual_seed(0)
    calls = []
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s))
    recipe.seed_batch(11, torch.device("cpu"))
    assert torch.equal(torch.randn(4, 3), expected) and calls == []
    recipe.seed_batch(12, torch.device("cuda", 0))
    assert calls == [12]
