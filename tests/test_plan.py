import pytest

from harness.plan.cells import all_patch_names, plan_cells
from harness.plan.placement import group_into_launches, stages
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
    # default: one launch per device; "world-size": one per (device, world size); "process": per patch set too
    (group,) = group_into_launches(cells)
    assert len(group) == len(cells)
    assert sorted(len(g) for g in group_into_launches(cells, per="world-size")) == [2, 3, 5]
    for g in group_into_launches(cells, per="world-size", isolate="process"):
        assert len({(c.device, c.world_size, c.variant, c.patches) for c in g}) == 1


def test_stages_one_world_size_at_a_time_on_slots_of_the_largest():
    cells = plan_cells([A, B], world_sizes=None, devices=["cpu"], variants=["vanilla", "patched"],
                       explicit_scenarios=False)
    plan = stages(cells, 4)
    assert [s.world_size for s in plan] == [4, 2, 1]
    by_index = {c.index: c for c in cells}
    for s in plan:
        assert len(s.slots) <= 4 // s.world_size
        assert all(by_index[i].world_size == s.world_size for slot in s.slots for i in slot)
        for slot in s.slots:  # vanilla before patched within a slot
            variants = [by_index[i].variant for i in slot]
            assert variants == sorted(variants, key=lambda v: v != "vanilla")
    assert sorted(i for s in plan for slot in s.slots for i in slot) == [c.index for c in cells]
    two = plan[1]
    assert len(two.slots) == 2 and all(two.slots)  # the 2-rank cells run side by side


def test_a_cpu_launch_takes_a_slot_per_hundred_cells_up_to_slots_and_cuda_none(monkeypatch):
    from harness.plan import placement

    cells = plan_cells([A, B], world_sizes=None, devices=["cpu"], variants=["vanilla", "patched"],
                       explicit_scenarios=False)
    assert placement.launch_world(cells, 1) == 4 and placement.launch_world(cells, 3) == 4  # too few cells
    monkeypatch.setattr(placement, "CELLS_PER_SLOT", 2)
    assert len(cells) // 2 >= 3
    assert [placement.launch_world(cells, n) for n in (1, 2, 3)] == [4, 8, 12]
    assert placement.launch_world(cells[:5], 3) == max(c.world_size for c in cells[:5]) * 2  # 5 cells: two slots
    gpu = plan_cells([A, B], world_sizes=None, devices=["cuda"], variants=["vanilla"], explicit_scenarios=False)
    assert placement.launch_world(gpu, 3) == 4  # a GPU per rank


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_documented_hang_is_balanced_and_a_certain_crash_runs_last(device):
    """On cuda a certain crash ends the launch: it runs alone, last. On CPU it runs in a
    forked process (``harness.rank.forked``): it takes a slot like the others, last in its slot."""
    from harness.spec import Expect

    hangs = _s("hangs", world_sizes=(2,), timeout_s=3, expect=(Expect(status="hang"),))
    crashy = _s("crashy", world_sizes=(2,), expect=(Expect(status="crash"),))
    cells = plan_cells([crashy, hangs, B], world_sizes=[2], devices=[device], variants=["vanilla"],
                       explicit_scenarios=False)
    plan = stages(cells, 4)
    names = [[[cells[i].scenario for i in slot] for slot in s.slots] for s in plan]
    if device == "cuda":
        assert names == [[["hangs"], ["b"]], [["crashy"]]]
    else:
        (stage,) = names
        (slot,) = [slot for slot in stage if "crashy" in slot]
        assert slot[-1] == "crashy" and sorted(sum(stage, [])) == ["b", "crashy", "hangs"] and len(stage) == 2


def test_the_api_variant_keeps_the_patches_the_api_does_not_replace():
    from harness.spec import UNUSED_PARAMS_API

    s = _s("moe", world_sizes=(2,), patches=("unused_param_reduction", "restore_unused_param_grads"),
           api=UNUSED_PARAMS_API)
    (api,) = plan_cells([s], world_sizes=None, devices=["cpu"], variants=["api"], explicit_scenarios=False)
    assert api.patches == ("restore_unused_param_grads",) and api.api_replaces == ("unused_param_reduction",)


def test_a_scenarios_cells_share_a_slot_and_follow_it_to_smaller_stages():
    """Each process pays once for what a scenario warms up: its variants run on one slot,
    and its world-size-1 cells on a rank that ran its world-size-2 cells."""
    scenarios = [_s(f"s{i}", world_sizes=(1, 2), patches=("p1",)) for i in range(6)]
    cells = plan_cells(scenarios, world_sizes=None, devices=["cpu"], variants=["vanilla", "patched", "deployed"],
                       explicit_scenarios=False, deployed_patches=("p1",))
    two, one = stages(cells, 4)
    assert two.world_size == 2 and one.world_size == 1
    for stage in (two, one):
        slot_of = {}
        for i, slot in enumerate(stage.slots):
            for index in slot:
                slot_of.setdefault(cells[index].scenario, set()).add(i)
        assert all(len(s) == 1 for s in slot_of.values()), slot_of
        assert max(map(len, stage.slots)) - min(map(len, stage.slots)) <= 3  # one scenario's worth
        if stage is two:
            ranks_at_two = {name: {2 * i, 2 * i + 1} for name, (i,) in slot_of.items()}
    for name, (i,) in slot_of.items():
        assert i in ranks_at_two[name], (name, i, ranks_at_two[name])


def test_a_lone_scenario_still_uses_every_slot():
    s = _s("only", world_sizes=(1,), patches=("p1",))
    cells = plan_cells([s], world_sizes=None, devices=["cpu"], variants=["vanilla", "patched", "deployed"],
                       explicit_scenarios=False, deployed_patches=("p1",))
    (stage,) = stages(cells, 4)
    assert sorted(map(len, stage.slots)) == [1, 1, 1]


def test_a_shuffled_order_is_seeded_and_keeps_what_keeps_a_launch_alive():
    """``run --shuffle SEED``: the same seed, the same stages; another seed, another order
    (patch sets interleaved); every cell once; cells that may end the process still last."""
    from harness.spec import Expect

    scenarios = [_s(f"s{i}", world_sizes=(1, 2), patches=("p1",)) for i in range(6)]
    crashy = _s("crashy", world_sizes=(1,), expect=(Expect(status="crash"),))
    cells = plan_cells([*scenarios, crashy], world_sizes=None, devices=["cpu"],
                       variants=["vanilla", "patched", "deployed"], explicit_scenarios=False, deployed_patches=("p1",))

    def order(plan):
        return [[list(slot) for slot in s.slots] for s in plan]

    planned = order(stages(cells, 2))
    assert order(stages(cells, 2, shuffle=7)) == order(stages(cells, 2, shuffle=7))
    assert order(stages(cells, 2, shuffle=7)) != planned
    assert order(stages(cells, 2, shuffle=7)) != order(stages(cells, 2, shuffle=8))
    interleaved = False
    for seed in range(5):
        plan = stages(cells, 2, shuffle=seed)
        assert [s.world_size for s in plan] == [2, 1]
        assert sorted(i for s in plan for slot in s.slots for i in slot) == [c.index for c in cells]
        for slot in plan[1].slots:
            if crashy.name in {cells[i].scenario for i in slot}:
                assert cells[slot[-1]].scenario == "crashy"
            variants = [cells[i].variant for i in slot]
            interleaved |= variants != sorted(variants, key=lambda v: v != "vanilla")
    assert interleaved  # the planned order keeps vanilla first in a slot; a shuffled one need not
