"""Public APIs as the ``api`` variant: declaration checks, availability per torch, and how
the FSDP side turns them on (``sharding`` fields, ``configure`` on every FSDP module)."""

import dataclasses

import pytest
import torch
from torch import nn

from harness.scenario.apis import UNUSED_PARAMS_API, PublicApi, torch_has
from harness.spec import Scenario, Sharding
from scenarios._models import MLP, randn_batch


def _api(**kw):
    return PublicApi(**{"name": "FSDPModule.set_force_sum_reduction_for_comms", "since": "2.8", "replaces": (),
                        "configure": lambda m, world: None, **kw})


def test_an_api_must_say_how_it_is_turned_on():
    with pytest.raises(ValueError, match="sharding fields, a configure call, or both"):
        PublicApi(name="FSDPModule.set_x", since="2.8", replaces=())
    with pytest.raises(ValueError, match="'Owner.attr'"):
        _api(name="set_force_sum_reduction_for_comms")
    with pytest.raises(ValueError, match="scales_grads needs a configure"):
        PublicApi(name="FSDPModule.set_x", since="2.8", replaces=(), sharding={"offload": True}, scales_grads=True)


def test_torch_has_reads_methods_and_dataclass_fields():
    assert torch_has("FSDPModule.set_requires_gradient_sync")
    assert torch_has("MixedPrecisionPolicy.reduce_dtype")
    assert not torch_has("MixedPrecisionPolicy.no_such_field")
    assert not torch_has("NoSuchOwner.set_requires_gradient_sync")
    override = "param_dtype_override_fn" in {f.name for f in dataclasses.fields(torch.distributed.fsdp.MixedPrecisionPolicy)}
    assert torch_has("MixedPrecisionPolicy.param_dtype_override_fn") == override


def test_available_needs_every_named_api():
    assert _api().available() == hasattr(torch.distributed.fsdp.FSDPModule, "set_force_sum_reduction_for_comms")
    assert not _api(needs=("FSDPModule.set_no_such_thing",)).available()
    assert UNUSED_PARAMS_API.available() == hasattr(torch.distributed.fsdp.FSDPModule,
                                                    "set_reduce_scatter_unused_params")


def test_with_api_sets_sharding_fields_and_reference_quirks():
    s = Scenario(name="s", model=MLP, batch=randn_batch(), sharding=Sharding(units=("layers.0",)),
                 api=_api(sharding={"offload": True, "mp_fields": {"cast_forward_inputs": False}},
                          reference_quirks=False))
    on = s.with_api()
    assert on.sharding.offload and on.sharding.units == ("layers.0",)
    assert on.sharding.mp_fields == {"cast_forward_inputs": False}
    assert on.reference_quirks is False and s.reference_quirks is True
    assert s.replace(api=_api()).with_api().reference_quirks is True  # None keeps the scenario's
    with pytest.raises(ValueError, match="declares no public API"):
        s.replace(api=None).with_api()



def test_build_model_configures_every_fsdp_module_children_first(one_rank_group, monkeypatch):
    from torch.distributed.device_mesh import init_device_mesh

    from harness.train.fsdp import build_model

    sharded = []
    original = torch.distributed.fsdp.fully_shard

    def spy(module, **kwargs):  # looked up at call time, so a patch of the public name is seen
        sharded.append(module)
        return original(module, **kwargs)

    monkeypatch.setattr(torch.distributed.fsdp, "fully_shard", spy)
    seen = []
    api = _api(configure=lambda module, world: seen.append((module, world)),
               sharding={"mp_fields": {"cast_forward_inputs": False}})
    s = Scenario(name="s", model=MLP, batch=randn_batch(), sharding=Sharding(units=("layers.0", "layers.2")), api=api)
    model = build_model(s.with_api(), init_device_mesh("cpu", (1,)), "cpu", api=api)
    assert sharded == [model.layers[0], model.layers[2], model]
    assert [m for m, _ in seen] == [model.layers[2], model.layers[0], model] and {w for _, w in seen} == {1}
    assert model._get_fsdp_state()._mp_policy.cast_forward_inputs is False
    plain = build_model(s, init_device_mesh("cpu", (1,)), "cpu")  # no api: nothing configured
    assert isinstance(plain, nn.Module) and len(seen) == 3
