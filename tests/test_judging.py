"""Judging (``harness.rank.judging``): one reference per (scenario as run, world size,
quirks, patch set where it touched what the reference uses), shared by the variants that
need it, never by those whose reference differs."""

import torch
from torch import nn

from harness.plan.cells import Cell
from harness.rank import judging
from harness.rank.judging import ReferenceCache
from harness.scenario.apis import UNUSED_PARAMS_API, PublicApi
from harness.spec import Scenario, Sharding
from harness.train.reference import GLOO_AVG_SUMS, run_reference
from harness.undertest.undo import PatchUndo


def _linear():
    return nn.Linear(3, 2, bias=False)


def _scenario(**kw):
    return Scenario(name="lin", summary="", model=_linear, batch=lambda ctx: torch.randn(2, 3), steps=2, **kw)


def _counting(monkeypatch):
    calls = []

    def counted(scenario, world_size, *, quirks=None):
        calls.append((scenario.name, world_size, tuple(quirks or ())))
        return run_reference(scenario, world_size, quirks=quirks)

    monkeypatch.setattr(judging, "run_reference", counted)
    return calls


def test_the_variants_of_a_scenario_share_one_reference(monkeypatch):
    calls = _counting(monkeypatch)
    cache, s = ReferenceCache(), _scenario()
    first = cache.get(s, 2, [])
    assert cache.get(s, 2, []) is first  # patched, deployed: the same recipe, world size and quirks
    api = s.replace(api=PublicApi(name="FSDPModule.set_reshard_after_backward", since="2.7", replaces=("p",),
                                  configure=lambda m, world: None))
    # the api variant of a scenario whose api changes nothing the reference reads: its other variants' reference
    assert cache.get(api.with_api(), 2, []) is cache.get(api, 2, [])
    assert len(calls) == 2 and cache.hits == 2


def test_what_changes_the_reference_gets_its_own(monkeypatch):
    calls = _counting(monkeypatch)
    cache, s = ReferenceCache(), _scenario(api=UNUSED_PARAMS_API)
    plain = cache.get(s, 2, [])
    summed = cache.get(s, 2, [GLOO_AVG_SUMS])  # the cell's probe saw gloo sum
    torch.testing.assert_close(summed[0].grads["weight"], plain[0].grads["weight"] * 2)
    assert cache.get(s, 4, []) is not plain
    assert cache.get(s.with_api(), 2, []) is not plain  # the api variant's sharding
    assert cache.get(s, 2, [], ("restore_unused_param_grads",)) is not plain  # a set that touched torch.optim
    assert cache.get(s.replace(sharding=Sharding(param_dtype=torch.bfloat16)), 2, []) is not plain
    assert len(calls) == 6 and cache.hits == 0


def test_the_cache_keeps_the_newest_few(monkeypatch):
    calls = _counting(monkeypatch)
    cache = ReferenceCache(keep=2)
    for world in (1, 2, 3, 1):
        cache.get(_scenario(), world, [])
    assert [c[1] for c in calls] == [1, 2, 3, 1] and len(cache.entries) == 2


def test_judging_with_a_shared_reference_gives_the_same_fields(monkeypatch):
    s = _scenario()
    cell = Cell(index=0, scenario="lin", variant="vanilla", device="cpu", backend="gloo", world_size=1, mesh=(1,),
                timeout_s=5.0)
    observed = run_reference(s, 1)
    cache = ReferenceCache()
    fresh = judging.judge(s, observed, cell)
    judging.judge(s, observed, cell, cache)
    shared = judging.judge(s, observed, cell, cache)
    assert cache.hits == 1 and shared == fresh and shared["status"] == "pass"


def test_the_undo_snapshot_names_the_modules_a_patch_set_changed(monkeypatch):
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    snap = PatchUndo.take()
    assert snap.changed_modules() == set()
    monkeypatch.setattr(_fsdp_collectives, "foreach_reduce", lambda *a, **k: None)
    assert snap.changed_modules() == {"torch.distributed.fsdp._fully_shard._fsdp_collectives"}
    assert snap.changed_modules(ignore="torch.distributed") == set()  # the reference never uses it
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)
    assert snap.changed_modules(ignore="torch.distributed") == {"torch.optim.adamw"}
