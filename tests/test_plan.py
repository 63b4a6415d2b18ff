import pytest

from harness.plan import LaunchPlan, all_patch_names, group_into_launches, plan_cells
from harness.spec import Scenario
from scenarios._models import MLP, randn_batch


def _s(name, **kw):
    return Scenario(name=name, summary="", model=MLP, batch=randn_batch(), **kw)


A = _s("a", world_sizes=(1, 2), patches=("p1",))
B = _s("b", world_sizes=(2, 4))


def test_plan_filters_unsupported_sizes_without_named_scenarios():
    cells = plan_cells([A, B], world_sizes=[2, 4], devices=["cpu"], variants=["vanilla"], explicit_scenarios=False)
    assert [(c.scenario, c.world_size) for c in cells] == [("a", 2), ("b", 2), ("b", 4)]


def test_plan_rejects_unsupported_size_for_named_scenario():
    with pytest.raises(ValueError, match="does not support world size 4"):
        plan_cells([A], world_sizes=[4], devices=["cpu"], variants=["vanilla"], explicit_scenarios=True)


@pytest.mark.parametrize("kw,msg", [({"devices": ["tpu"]}, "unknown device"), ({"variants": ["both"]}, "unknown variant")])
def test_plan_rejects_bad_device_and_variant(kw, msg):
    args = dict(world_sizes=None, devices=["cpu"], variants=["vanilla"], explicit_scenarios=False) | kw
    with pytest.raises(ValueError, match=msg):
        plan_cells([A], **args)


def test_variants_patched_only_with_patches_deployed_everywhere_and_grouping():
    cells = plan_cells(
        [A, B], world_sizes=None, devices=["cpu"], variants=["vanilla", "patched", "deployed", "api"],
        explicit_scenarios=False, deployed_patches=all_patch_names([A, B]) + ("p2",),
    )
    assert {c.variant for c in cells if c.scenario == "b"} == {"vanilla", "deployed"}  # no patches, no API
    assert all(c.patches == ("p1", "p2") for c in cells if c.variant == "deployed")
    assert all(c.patches == ("p1",) for c in cells if c.variant == "patched")
    assert all(c.scenario_patches == ("p1",) for c in cells if c.scenario == "a")
    cells = [c for c in cells if c.variant != "deployed"]
    # default: one launch per (device, world size), vanilla first, each patch set together
    groups = group_into_launches(cells)
    assert sorted(len(g) for g in groups) == [1, 2, 3]
    for g in groups:
        assert len({(c.device, c.world_size) for c in g}) == 1
        variants = [c.variant for c in g]
        assert variants == sorted(variants, key=lambda v: v != "vanilla")
    # process isolation: a launch per patch set too
    for g in group_into_launches(cells, isolate="process"):
        assert len({(c.device, c.world_size, c.variant, c.patches) for c in g}) == 1


def test_risky_cells_run_last_in_a_launch():
    from harness.spec import Expect

    crashy = _s("crashy", world_sizes=(2,), expect=(Expect(status="crash"),))
    cells = plan_cells([crashy, B], world_sizes=[2], devices=["cpu"], variants=["vanilla"], explicit_scenarios=False)
    (group,) = group_into_launches(cells)
    assert [c.scenario for c in group] == ["b", "crashy"]


def test_launch_plan_roundtrip(tmp_path):
    cells = plan_cells([A], world_sizes=None, devices=["cpu"], variants=["patched"], explicit_scenarios=False)
    plan = LaunchPlan(run_id="r", launch_id="l", device="cpu", world_size=1, patches_module="m",
                      patches_module_id="m (m.py, sha256 0)", patch_mapping={}, out_path="o", progress_path="p",
                      cells=cells)
    plan.dump(tmp_path / "p.json")
    assert LaunchPlan.load(str(tmp_path / "p.json")) == plan
