"""The launcher <-> worker protocol (``harness.protocol``): the plan file and the files beside
it, progress lines, phases and their order, and the store keys of cells and stages."""

import json
import time

import pytest
import torch.distributed as dist

from harness.launch.follow import LaunchFollower
from harness.plan.cells import Cell
from harness.plan.placement import Stage
from harness.protocol import (
    IDLE,
    SETUP_PHASES,
    CellKeys,
    LaunchPlan,
    ProgressEvent,
    RankExit,
    install_phase,
    mark_started,
    parse_progress,
    phase_key,
    phase_words,
    read_exit,
    read_phase,
    stage_done,
    step_phase,
    write_exit,
    write_phase,
)
from harness.runconfig import RunConfig


def _cell(index, **kw):
    base = dict(index=index, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=5.0)
    return Cell(**(base | kw))


def _plan(tmp_path, launch_id="L7"):
    return LaunchPlan(
        run_id="run1", launch_id=launch_id, device="cpu", world_size=4,
        config=RunConfig(patches="fsdp_patches", patch_mapping={"p1": "fix_p1"}, scenario_dirs=[str(tmp_path / "scen")],
                         dump=tmp_path / "dump", shuffle=3, run_id="run1", out=tmp_path / "out.jsonl"),
        patches_module_id="fsdp_patches@abc", out_path=str(tmp_path / "out.jsonl"), folder=str(tmp_path / "launch"),
        cells=[
            _cell(3, variant="patched", world_size=4, mesh=(2, 2), patches=("p1", "p2"), scenario_patches=("p1",),
                  expected=("error", "hang"), expected_match="boom", fixed_by="p1", api_replaces=("p2",)),
            _cell(5, timeout_s=7.5, bug_observable=False),
        ],
        stages=[Stage(world_size=4, slots=[[3]]), Stage(world_size=2, slots=[[5], []])],
    )


# --------------------------------------------------------------------------- the plan file


def test_plan_survives_dump_and_load(tmp_path):
    plan = _plan(tmp_path)
    path = plan.dump()
    assert path == plan.plan_file and path.exists()
    loaded = LaunchPlan.load(path)
    assert loaded == plan  # tuples, nested cells and stages, the run configuration included
    assert loaded.config.dump == tmp_path / "dump" and loaded.config.shuffle == 3
    assert loaded.cells[0].mesh == (2, 2) and loaded.cells[0].expected == ("error", "hang")
    assert loaded.cell(5) is loaded.cells[1] and loaded.cell(3).patches == ("p1", "p2")
    assert loaded.stages[1].cells_of(0) == [5] and loaded.stages[1].cells_of(1) == []


def test_dump_starts_an_empty_progress_file(tmp_path):
    plan = _plan(tmp_path)
    plan.dump()
    mark_started(plan.progress_file, 3, [0, 1, 2, 3])
    assert plan.progress_file.read_text()
    plan.dump()  # a relaunch of the same plan starts over
    assert plan.progress_file.read_text() == ""


def test_launch_files_are_named_by_launch_and_rank(tmp_path):
    plan = _plan(tmp_path)
    folder = tmp_path / "launch"
    assert plan.plan_file == folder / "L7.json"
    assert plan.log_file == folder / "L7.log"
    assert plan.progress_file == folder / "L7.progress"
    assert plan.stamp_file(3) == folder / "L7.rank3.phase"
    assert plan.crash_file(3) == folder / "L7.rank3.crash"
    other = _plan(tmp_path, launch_id="L8")
    names = [f(p) for p in (plan, other) for f in (lambda p: p.plan_file, lambda p: p.log_file,
                                                   lambda p: p.progress_file)]
    names += [f(r) for p in (plan, other) for f in (p.stamp_file, p.crash_file) for r in (0, 1, 11)]
    assert len(set(names)) == len(names)  # two launches in one folder never share a file


# --------------------------------------------------------------------------- progress


def test_progress_lines_come_back_as_events(tmp_path):
    path = tmp_path / "L.progress"
    before = time.time()
    mark_started(path, 3, [0, 1])
    mark_started(path, 5, [2, 3])
    events = [parse_progress(line) for line in path.read_text().splitlines()]
    assert [(e.cell, e.ranks) for e in events] == [(3, (0, 1)), (5, (2, 3))]
    assert all(isinstance(e, ProgressEvent) and before <= e.t <= before + 60 for e in events)


def test_parse_progress_skips_other_events_and_defaults_ranks():
    assert parse_progress(json.dumps({"cell": 1, "event": "end", "t": 1.0})) is None
    assert parse_progress(json.dumps({"cell": "4", "event": "start", "t": 2})) == ProgressEvent(cell=4, t=2.0, ranks=())


def test_a_torn_last_progress_line_waits_for_its_end(tmp_path):
    progress, out = tmp_path / "L.progress", tmp_path / "out.jsonl"
    out.write_text("")
    mark_started(progress, 3, [0, 1])
    torn = json.dumps({"cell": 5, "event": "start", "t": 9.0, "ranks": [2, 3]}) + "\n"
    with open(progress, "a") as f:
        f.write(torn[:20])  # a writer caught mid-line
    with pytest.raises(ValueError):
        parse_progress(torn[:20])  # so a reader must hand parse_progress whole lines only
    follower = LaunchFollower(progress_path=progress, out_path=out, launch_id="L")
    assert set(follower.open_cells()) == {3}
    with open(progress, "a") as f:
        f.write(torn[20:])
    opened = follower.open_cells()
    assert set(opened) == {3, 5} and opened[5] == 9.0
    assert follower.ranks == {3: [0, 1], 5: [2, 3]}


def test_a_launch_is_finished_once_every_cell_is_recorded_and_every_rank_wrote_its_times_after(tmp_path):
    """What is left then is the processes' exit and torchrun's teardown, which the launcher
    does not wait for (about a second of every launch)."""
    import os

    from tests.support import make_record

    progress, out = tmp_path / "L.progress", tmp_path / "out.jsonl"
    out.write_text("")
    progress.write_text("")
    times = [tmp_path / "L.rank0.phases", tmp_path / "L.rank1.phases"]
    follower = LaunchFollower(progress_path=progress, out_path=out, launch_id="L")
    times[0].write_text("{}")  # a stage's end before the last cell
    with open(out, "a") as f:
        f.write(make_record(launch_id="L", cell=0).to_json() + "\n")
    follower.new_records()
    assert not follower.finished({0, 1}, times)  # cell 1 not recorded
    with open(out, "a") as f:
        f.write(make_record(launch_id="L", cell=1).to_json() + "\n")
    follower.new_records()
    behind, ahead = out.stat().st_mtime_ns - 10**9, out.stat().st_mtime_ns + 10**9
    os.utime(times[0], ns=(behind, behind))
    assert not follower.finished({0, 1}, times)  # rank 1 has not written its times
    times[1].write_text("{}")
    os.utime(times[1], ns=(ahead, ahead))
    assert not follower.finished({0, 1}, times)  # rank 0's are from before the last record
    os.utime(times[0], ns=(ahead, ahead))
    assert follower.finished({0, 1}, times)


# --------------------------------------------------------------------------- phases


def test_phase_file_roundtrip(tmp_path):
    path = tmp_path / "L.rank0.phase"
    assert read_phase(path) is None  # not stamped yet
    write_phase(path, "step 0 micro-batch 1 backward")
    assert read_phase(path) == "step 0 micro-batch 1 backward"
    write_phase(path, IDLE)
    assert read_phase(path) == IDLE


@pytest.mark.parametrize("text", ["", '{"phase": "step 0', "[1, 2]", "null", '{"t": 1.0}'])
def test_unreadable_phase_file_reads_as_none(tmp_path, text):
    path = tmp_path / "L.rank0.phase"
    path.write_text(text)
    assert read_phase(path) is None


def test_step_phase_names():
    assert step_phase(0, "backward", 1) == "step 0 micro-batch 1 backward"
    assert step_phase(2, "clip") == "step 2 clip"
    assert step_phase(3, "forward", 0) == "step 3 micro-batch 0 forward"


def test_phase_key_orders_a_cell_from_idle_to_reference():
    in_order = [
        IDLE, *SETUP_PHASES,
        step_phase(0, "forward", 0), step_phase(0, "backward", 0),
        step_phase(0, "forward", 1), step_phase(0, "backward", 1),
        step_phase(0, "forward", 2), step_phase(0, "forward", 10),  # numbers, not text: 2 before 10
        step_phase(0, "clip"), step_phase(0, "gather params"),
        step_phase(2, "forward", 0), step_phase(10, "forward", 0),
        step_phase(10, "gather snapshots"),
        "a phase the harness does not know",
        "reference",
    ]
    keys = [phase_key(p) for p in in_order]
    assert all(a < b for a, b in zip(keys, keys[1:])), [(p, k) for p, k in zip(in_order, keys)]
    assert sorted(reversed(in_order), key=phase_key) == in_order


def test_one_patchs_install_is_an_install_phase_in_words_and_in_order():
    phase = install_phase("uniform_reduce_dtype")
    assert phase == "install patches: uniform_reduce_dtype"
    assert phase_key(phase) == phase_key("install patches") < phase_key("init group")
    assert phase_words(phase) == "during install of patch uniform_reduce_dtype"
    assert phase_words("import patches") == "during import of the patches module"
    assert phase_words(step_phase(0, "forward", 1)) == "during 'step 0 micro-batch 1 forward'"
    assert phase_words(None) == phase_words(IDLE) == "between cells"


def test_exit_file_roundtrip(tmp_path):
    plan = LaunchPlan(run_id="r", launch_id="L", device="cpu", world_size=2, config=RunConfig(patches="m", patch_mapping={}),
                      patches_module_id="m", out_path=str(tmp_path / "o.jsonl"), folder=str(tmp_path))
    path = plan.exit_file(1)
    assert path == tmp_path / "L.rank1.exit" and read_exit(path) is None
    write_exit(path, 7, install_phase("p"))
    assert read_exit(path) == RankExit(code=7, phase="install patches: p")
    path.write_text('{"code": "x"}')
    assert read_exit(path) is None


def test_phase_key_no_phase_is_idle():
    assert phase_key(None) == phase_key("") == phase_key(IDLE) < phase_key(SETUP_PHASES[0])


# --------------------------------------------------------------------------- store keys


def test_cell_keys_are_unique_per_launch_cell_and_rank():
    keys = []
    for launch in ("L7", "L8"):
        for index in (1, 2, 12):
            k = CellKeys(launch_id=launch, index=index)
            keys += [k.status(r) for r in (0, 1, 11)] + [k.recorded, k.abandoned, k.group]
        keys += [stage_done(launch, s, r) for s in (0, 1) for r in (0, 1, 11)]
    assert len(set(keys)) == len(keys)
    k = CellKeys(launch_id="L7", index=12)
    assert all(key.startswith(k.prefix + "/") for key in (k.status(0), k.recorded, k.abandoned, k.group))


def test_cell_groups_do_not_share_store_keys():
    """Cells 1 and 12 of a launch: their groups' PrefixStores keep the same inner key apart."""
    store = dist.HashStore()
    one = dist.PrefixStore(CellKeys(launch_id="L", index=1).group, store)
    twelve = dist.PrefixStore(CellKeys(launch_id="L", index=12).group, store)
    one.set("rank0", "a")
    twelve.set("rank0", "b")
    assert one.get("rank0") == b"a" and twelve.get("rank0") == b"b"


def test_stage_done_is_per_stage():
    store = dist.HashStore()
    for r in range(2):
        store.set(stage_done("L", 0, r), "done")
    assert store.check([stage_done("L", 0, r) for r in range(2)])
    assert not store.check([stage_done("L", 1, 0)])
    assert not store.check([stage_done("L9", 0, 0)])
