"""The launcher classifies a hanging and an aborting cell and still runs the cells after them."""

import time

import pytest

from harness.launch import LaunchOptions, run_cells
from harness.plan import plan_cells
from harness.registry import load_scenarios
from tests.conftest import FIXTURE_SCENARIOS

pytestmark = pytest.mark.slow


def test_hang_abort_and_error_are_classified_and_later_cells_run(tmp_path):
    scenarios = load_scenarios([str(FIXTURE_SCENARIOS)]).scenarios
    chosen = [scenarios[n] for n in ["fault_hang", "fault_abort", "fault_raise", "fault_after"]]
    cells = plan_cells(chosen, world_sizes=None, devices=["cpu"], variants=["vanilla"], explicit_scenarios=True)
    assert len({c.world_size for c in cells}) == 1  # one launch group: faults must not stop the rest
    assert [c.risk for c in cells] == [2, 3, 1, 0]  # planned: hang/crash-prone cells would go last
    for c in cells:
        c.risk = 0  # keep the file order here, so cells run after the hang and the abort
    opts = LaunchOptions(run_id="t", out_path=tmp_path / "r.jsonl", log_dir=tmp_path / "logs",
                         scenario_dirs=[str(FIXTURE_SCENARIOS)])
    t0 = time.time()
    records = [r.__dict__ for r in run_cells(cells, opts)]
    wall = time.time() - t0
    by_name = {r["scenario"]: r for r in records}
    assert [r["scenario"] for r in records] == ["fault_hang", "fault_abort", "fault_raise", "fault_after"]
    timeout = cells[0].timeout_s
    hang = by_name["fault_hang"]
    assert hang["status"] == "hang" and hang["as_expected"]
    assert hang["duration_s"] <= timeout + 10
    crash = by_name["fault_abort"]
    assert crash["status"] == "crash" and "SIGABRT" in crash["exc_msg"] and crash["failing_rank"] == 1
    assert crash["duration_s"] <= timeout + 10
    error = by_name["fault_raise"]
    assert error["status"] == "error" and error["failing_rank"] == 1 and "planted failure" in error["exc_msg"]
    assert error["duration_s"] <= timeout  # the blocked peer fails fast, not at the timeout
    # ... and the launch survives it: the next cell ran in the same torchrun
    assert by_name["fault_after"]["launch_id"] == error["launch_id"] != "launcher"
    assert by_name["fault_after"]["status"] == "pass"
    # every record reached the file, in order
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert wall < 4 * timeout + 60


def test_two_launchers_act_as_two_nodes(tmp_path):
    """--nnodes/--node-rank/--rdzv-endpoint pass through to torchrun; node 0 records."""
    import json
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--scenario", "plain", "--scenario", "hsdp", "--world-size", "2", "--variant", "vanilla",
              "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "two-nodes", "--quiet"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "harness", "run", *common, "--node-rank", str(k),
                          "--out", str(tmp_path / f"node{k}.jsonl")], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in (1, 0)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert procs[1].returncode == 0, outputs[1]
    records = [json.loads(line) for line in (tmp_path / "node0.jsonl").read_text().splitlines()]
    assert sorted((r["scenario"], r["world_size"], r["status"]) for r in records) == [
        ("hsdp", 2, "pass"), ("plain", 2, "pass")]
    assert (tmp_path / "node1.jsonl").read_text() == ""  # only global rank 0 writes records


def test_multi_node_needs_endpoint_and_run_id():
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "plain", "--world-size", "2",
                          "--nnodes", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: multi-node runs need --rdzv-endpoint HOST:PORT and the same --run-id on every node"
