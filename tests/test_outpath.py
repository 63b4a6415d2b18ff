"""The launch folder stays bounded: old launches' files go at a run's start, a recent one's never."""

import dataclasses
import json
import os
import time

from harness.launch import outpath
from harness.plan.cells import Cell
from harness.protocol import LaunchPlan
from harness.runconfig import RunConfig


def _launch(folder, launch_id, age_s, *, handoff=False):
    names = [f"{launch_id}.json", f"{launch_id}.log", f"{launch_id}.progress", f"{launch_id}.rank0.phases",
             f"{launch_id}.rank1.crash"]
    if handoff:
        names += [f"{launch_id}.cell3.observed", f"{launch_id}.cell2.observed.pt", f"{launch_id}.cell3.verdict.json"]
        (folder / f"{launch_id}.references").mkdir()
        (folder / f"{launch_id}.references" / "ref.pt").write_bytes(b"x")
    then = time.time() - age_s
    for n in names:
        (folder / n).write_text("x")
        os.utime(folder / n, (then, then))
    return names


def test_launches_beyond_the_newest_go_with_their_hand_off_and_recent_or_foreign_files_stay(tmp_path):
    logs = tmp_path / "r.logs"
    logs.mkdir()
    old = [f"20261201-0000{i:02d}-L1-{i:06x}" for i in range(6)]  # oldest first
    for i, launch in enumerate(old):
        _launch(logs, launch, age_s=10_000 - i * 100, handoff=True)
    busy = "20261130-000000-L2"  # a multi-node launch id (no suffix), oldest of all, but its progress just moved
    _launch(logs, busy, age_s=20_000)
    os.utime(logs / f"{busy}.progress")
    (logs / "notes.txt").write_text("mine")  # not a launch's file
    dotted = "v1.2-L1-abcdef"  # a run id with a dot
    _launch(logs, dotted, age_s=30_000)

    outpath._prune(logs, keep=3, idle_s=3600)
    left = {p.name for p in logs.iterdir()}
    newest, gone = old[-2:], old[:-2]  # the busy launch counts among the newest 3
    for launch in gone + [dotted]:
        assert not [n for n in left if n.startswith(launch + ".")], launch
    for launch in newest:
        assert {f"{launch}.json", f"{launch}.log", f"{launch}.rank1.crash"} <= left
        assert not {f"{launch}.cell3.observed", f"{launch}.cell2.observed.pt", f"{launch}.cell3.verdict.json",
                    f"{launch}.references"} & left
    assert f"{busy}.rank0.phases" in left and "notes.txt" in left


def test_prepare_out_prunes_and_a_recent_launch_keeps_even_its_hand_off(tmp_path):
    logs = tmp_path / "r.logs"
    logs.mkdir()
    recent = "20261201-000000-L1-aaaaaa"
    names = _launch(logs, recent, age_s=10, handoff=True)
    old = "20261101-000000-L1-bbbbbb"
    _launch(logs, old, age_s=10 * 86400)
    outpath.prepare_out(tmp_path / "r.jsonl", logs)
    left = {p.name for p in logs.iterdir()}
    assert set(names) | {f"{recent}.references"} <= left
    assert f"{old}.json" in left  # within the newest KEEP_LAUNCHES
    for i in range(outpath.KEEP_LAUNCHES):
        _launch(logs, f"20261102-0000{i:02d}-L1-{i:06x}", age_s=9 * 86400)
    outpath.prepare_out(tmp_path / "r.jsonl", logs)
    assert not (logs / f"{old}.json").exists() and (logs / f"{recent}.json").exists()


def test_a_launch_a_record_names_stays_and_only_node_0_drops_the_hand_off(tmp_path):
    logs = tmp_path / "r.logs"
    logs.mkdir()
    launches = [f"20261101-0000{i:02d}-L1-{i:06x}" for i in range(4)]
    for i, launch in enumerate(launches):
        _launch(logs, launch, age_s=90_000 - i * 100)
    out, previous = tmp_path / "r.jsonl", tmp_path / "r.jsonl.previous"
    out.write_text(json.dumps({"status": "hang", "log": str(logs / f"{launches[0]}.log")}) + "\n")
    previous.write_text(json.dumps({"status": "crash", "log": str(logs / f"{launches[1]}.log")}) + "\n")
    outpath._prune(logs, keep=1, records=[out, previous, tmp_path / "missing.jsonl"])
    left = {p.name for p in logs.iterdir()}
    assert {f"{launches[0]}.log", f"{launches[1]}.json", f"{launches[3]}.json"} <= left
    assert f"{launches[2]}.json" not in left

    plan = LaunchPlan(config=RunConfig(node_rank=1, nnodes=2, rdzv_endpoint="h:1", run_id="x"), run_id="x",
                      launch_id="x-L1", device="cpu", world_size=2, patches_module_id="", out_path=str(out),
                      folder=str(logs), cells=[Cell(scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=2,
                                                       mesh=(2,), timeout_s=30.0, index=0)])
    plan.observed_file(0).write_bytes(b"x")
    outpath.drop_handoff(plan)  # another node's launcher: node 0 may still read it
    assert plan.observed_file(0).exists()
    outpath.drop_handoff(dataclasses.replace(plan, config=RunConfig(run_id="x")))
    assert not plan.observed_file(0).exists()


def test_kept_references_beyond_the_limit_go_least_recently_used_first(tmp_path):
    kept = tmp_path / "references"
    kept.mkdir()
    for n, age in enumerate((50, 10, 40, 20)):  # seconds since each was last used
        f = kept / f"r{n}.pt"
        f.write_bytes(b"x" * 100)
        os.utime(f, (time.time() - age,) * 2)
    (kept / "r9.pt.123.tmp").write_bytes(b"x")  # a writer still at it: stays
    stale = kept / "r8.456.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * outpath.IDLE_S,) * 2)  # one that died long ago: goes
    outpath._prune_kept(kept, limit=250)
    assert sorted(p.name for p in kept.iterdir()) == ["r1.pt", "r3.pt", "r9.pt.123.tmp"]
    outpath._prune_kept(tmp_path / "none")  # no folder yet: nothing to do
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * outpath.IDLE_S,) * 2)
    outpath.prepare_out(tmp_path / "r.jsonl", tmp_path)  # each run's start prunes them
    assert not stale.exists() and (kept / "r1.pt").exists()
