"""The launcher under faults: hangs, aborts, exceptions, hung patches, NaNs, signals;
every cell accounted for and no process left behind."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.launch.launcher import LaunchOptions, run_cells
from harness.plan.cells import plan_cells
from harness.runconfig import RunConfig
from harness.scenario.load import load_scenarios
from tests.support import FIXTURE_SCENARIOS, ROOT

pytestmark = pytest.mark.slow


def _cells(names, **kw):
    scenarios = load_scenarios([str(FIXTURE_SCENARIOS)]).scenarios
    args = dict(world_sizes=None, devices=["cpu"], variants=["vanilla"], explicit_scenarios=True) | kw
    return plan_cells([scenarios[n] for n in names], **args)


def _descendants_of_launches(tmp_path) -> list[str]:
    return [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
@pytest.mark.parametrize("name, stuck, how", [("fault_gil_deadlock", 1, "rank 1 never reported"),
                                              ("fault_gil_deadlock_judge", 0, "launch killed")])
def test_a_rank_stuck_in_c_holding_the_gil_has_its_threads_stacks_on_the_hang_record(tmp_path, name, stuck, how):
    """The judge records the cell (rank 1 stuck), or the launcher does once it kills the launch (rank 0's
    cell process stuck, the judge waiting on it): either way the record shows where the stuck rank's threads were."""
    cells = _cells([name, "fault_after"])
    opts = LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", scenario_dirs=[str(FIXTURE_SCENARIOS)]),
                         log_dir=tmp_path / "logs")
    by = {r.scenario: r for r in run_cells(cells, opts).records}
    rec = by[name]
    assert rec.status == "hang" and rec.as_expected and how in rec.exc_msg, rec.exc_msg
    head = f"--- rank {stuck}: its threads 1 s after the deadline ---"
    assert rec.traceback.startswith("--- rank ") and head in rec.traceback, rec.traceback
    block = rec.traceback.split(head, 1)[1].split("\n--- rank ")[0]
    assert f"_deadlock_rank{stuck}" in block and "_deadlock_in_c" in block, rec.traceback
    assert by["fault_after"].status == "pass"


def test_faults_are_classified_within_their_timeout_and_later_cells_run(tmp_path):
    cells = _cells(["fault_hang", "fault_hang_rank1", "fault_abort", "fault_raise", "fault_after"])
    opts = LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", scenario_dirs=[str(FIXTURE_SCENARIOS)]),
                         log_dir=tmp_path / "logs")
    t0 = time.time()
    result = run_cells(cells, opts)
    wall = time.time() - t0
    by = {r.scenario: r for r in result.records}
    assert sorted(by) == sorted(c.scenario for c in cells) and not result.not_run
    timeout = cells[0].timeout_s
    hang = by["fault_hang"]
    assert hang.status == "hang" and hang.as_expected and hang.duration_s <= timeout + 2
    one = by["fault_hang_rank1"]  # rank 1 is the one that did not arrive, not rank 0 who waited for it
    assert one.status == "hang" and one.failing_rank == 1 and one.duration_s <= timeout + 2
    assert "rank(s) [1] did not arrive" in one.exc_msg
    assert "rank 1 was in _hang_rank1 (launcher_faults.py:" in one.exc_msg
    assert "during 'step 0 micro-batch 0 forward'" in one.exc_msg
    assert "rank 0 waited in a collective" in one.exc_msg or "rank 0 lost its peers" in one.exc_msg
    crash = by["fault_abort"]
    assert crash.status == "crash" and "SIGABRT" in crash.exc_msg and crash.failing_rank == 1
    error = by["fault_raise"]
    assert error.status == "error" and error.failing_rank == 1 and "planted failure" in error.exc_msg
    assert error.duration_s <= 2  # the blocked peer fails at once, not at the timeout
    # hangs are caught inside the worker, and the abort ran in a forked child of each rank:
    # every cell, the ones after them included, ran in the same launch
    assert hang.launch_id == one.launch_id == crash.launch_id == by["fault_after"].launch_id != "launcher"
    assert by["fault_after"].status == "pass"
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == len(cells)
    assert wall < 2 * timeout + 60
    assert _descendants_of_launches(tmp_path) == []
    # what the ranks handed the referee (snapshots, verdicts) went with the launch; its log and plan stay
    left = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert any(n.endswith(".log") for n in left) and any(n.endswith(".json") for n in left), left
    assert not [n for n in left if n.endswith((".observed", ".verdict.json", ".references"))], left


def test_non_finite_reference_means_a_wrong_scenario_and_fsdp_only_nan_a_mismatch(tmp_path):
    cells = _cells(["fault_nan_reference", "fault_nan_fsdp"])
    result = run_cells(cells, LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", scenario_dirs=[str(FIXTURE_SCENARIOS)]),
                         log_dir=tmp_path / "l"))
    by = {r.scenario: r for r in result.records}
    ref = by["fault_nan_reference"]
    assert (ref.status, ref.exc_type) == ("error", "ScenarioError") and "the scenario is wrong" in ref.exc_msg
    fsdp = by["fault_nan_fsdp"]
    assert fsdp.status == "mismatch" and "non-finite" in fsdp.worst and fsdp.as_expected


@pytest.mark.parametrize("module", ["sleepy_patches.py", "sleepy_import_patches.py"])
def test_a_hung_patches_module_is_a_hang_within_the_timeout_and_the_run_goes_on(tmp_path, module):
    """Hung at install (or at import): the first cell of the set is a hang, the rest of that
    set is not retried, and the vanilla cells still run."""
    out = tmp_path / "r.jsonl"
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "c_skipped_vision_tower",
                          "--world-size", "1", "--world-size", "2", "--variant", "vanilla", "--variant", "patched",
                          "--patches", f"tests/fixtures/{module}", "--timeout", "4", "--out", str(out), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    wall = time.time() - t0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    patched = [r for r in records if r["variant"] == "patched"]
    assert [r["status"] for r in records if r["variant"] == "vanilla"] == ["error", "error"]  # C, as documented
    assert {r["status"] for r in patched} == {"hang"} and len(patched) == 2
    first = min(patched, key=lambda r: r["started_at"])
    assert first["duration_s"] <= 4 + 5
    phase = "import patches" if "import" in module else "install patches"
    assert phase in (first["exc_msg"] or "")
    assert res.returncode == 1 and wall < 60
    assert _descendants_of_launches(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_reaps_everything_and_nothing_is_written_after(tmp_path, sig):
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--scenarios-dir", str(FIXTURE_SCENARIOS),
                             "--scenario", "fault_after", "--scenario", "fault_hang", "--variant", "vanilla",
                             "--timeout", "60", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 90
    while time.time() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.2)  # wait until a cell has finished and the hanging one runs
    assert out.read_text().count("\n") == 1, "the first cell never finished"
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True)]
    # workers forked from the launch's forkserver carry its command line (``harness.launch.forkserver``)
    assert sum("harness.launch.forkserver serve" in " ".join(p.cmdline()) for p in workers) >= 2
    t0 = time.time()
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=30)
    assert time.time() - t0 < 5 and proc.returncode == 128 + sig
    assert f"interrupted by {signal.Signals(sig).name}: 1 cells recorded, 1 not run" in output
    assert "fault_after" in output.split("interrupted")[0]  # the summary of finished cells
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == []
    size = out.stat().st_size
    time.sleep(2)
    assert out.stat().st_size == size


def test_two_launchers_act_as_two_nodes(tmp_path):
    """--nnodes/--node-rank/--rdzv-endpoint pass through to torchrun; node 0 records."""
    import socket

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
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "plain", "--world-size", "2",
                          "--nnodes", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: multi-node runs need --rdzv-endpoint HOST:PORT and the same --run-id on every node"


@pytest.mark.parametrize(("args", "message"), [
    (["--timeout", "-1"], "error: run: argument --timeout: must be a finite number of seconds > 0, got '-1'"),
    (["--timeout", "nan"], "error: run: argument --timeout: must be a finite number of seconds > 0, got 'nan'"),
    (["--timeout", "inf"], "error: run: argument --timeout: must be a finite number of seconds > 0, got 'inf'"),
    (["--timeout", "0"], "error: run: argument --timeout: must be a finite number of seconds > 0, got '0'"),
    (["--world-size", "0"], "error: run: argument --world-size: must be a positive integer, got '0'"),
    (["--slots", "0"], "error: run: argument --slots: must be a positive integer, got '0'"),
    (["--slots", "2", "--nnodes", "2"], "error: --slots is for single-node runs"),
])
def test_bad_numbers_are_one_line_and_exit_2(args, message):
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "plain", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip()) == (2, message)


def test_two_slots_run_two_cells_of_the_largest_world_size_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.plan.placement.CELLS_PER_SLOT", 1)  # two cells are enough for two slots
    cells = _cells(["plain", "hsdp"], world_sizes=[2])
    assert len(cells) == 2
    opts = LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", slots=2), log_dir=tmp_path / "logs")
    result = run_cells(cells, opts)
    assert len(result.records) == 2 and all(r.as_expected for r in result.records)
    (progress,) = (tmp_path / "logs").glob("*.progress")
    starts = [json.loads(line) for line in progress.read_text().splitlines()]
    assert {tuple(s["ranks"]) for s in starts if s["event"] == "start"} == {(0, 1), (2, 3)}  # a 4-rank launch
    assert _descendants_of_launches(tmp_path) == []


def test_a_broken_scenario_file_is_named_recorded_and_the_others_run(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "oops_syntax.py").write_text("from harness.spec import Scenario\nSCENARIO = Scenario(\n")
    (folder / "oops_raises.py").write_text("import torch\n\nraise RuntimeError('cannot build the model')\n")
    (folder / "fine.py").write_text((ROOT / "scenarios" / "plain.py").read_text())
    out = tmp_path / "r.jsonl"
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--scenarios-dir", str(folder), "--scenario",
                          "oops_syntax", "--scenario", "oops_raises", "--scenario", "fine", "--world-size", "1",
                          "--out", str(out), "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert f"{folder / 'oops_syntax.py'}:2: SyntaxError: '(' was never closed" in res.stderr
    assert f"{folder / 'oops_raises.py'}:3: RuntimeError: cannot build the model" in res.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    broken = {r["scenario"]: r for r in records if r["exc_type"] == "ScenarioLoadError"}
    assert set(broken) == {"oops_syntax", "oops_raises"} and not any(r["as_expected"] for r in broken.values())
    assert {r["status"] for r in records if r["scenario"] == "fine"} == {"pass"}


def test_cells_that_may_abort_run_after_backward_on_a_cuda_build_of_torch(tmp_path):
    """CUDA builds of torch (2.11+) refuse autograd in a process forked after FSDP2 ran a
    backward: the abort-prone cells must be forked from the zygote, not from the worker."""
    python = ROOT / ".nox" / "matrix-torch-2-15-0-device-cpu" / "bin" / "python"
    if not python.exists():
        pytest.skip("needs the torch 2.15.0 (CUDA build) venv of `nox -s matrix`")
    out = tmp_path / "r.jsonl"
    subprocess.run([str(python), "-m", "harness", "run", "--quiet", "--scenario", "plain", "--scenario",
                    "a_rank_divergent", "--variant", "vanilla", "--world-size", "2", "--out", str(out)],
                   cwd=ROOT, timeout=300, check=False, capture_output=True)
    records = {r["scenario"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["plain"]["status"] == "pass"
    crash = records["a_rank_divergent"]
    assert crash["status"] == "crash" and crash["as_expected"], crash["exc_msg"]
    assert crash["launch_id"] == records["plain"]["launch_id"]


def test_a_scenario_whose_package_is_missing_is_skipped_with_the_reason_and_not_as_documented(tmp_path):
    cells = _cells(["fault_missing_package", "fault_after"])
    opts = LaunchOptions(config=RunConfig(run_id="t", out=tmp_path / "r.jsonl", scenario_dirs=[str(FIXTURE_SCENARIOS)]),
                         log_dir=tmp_path / "logs")
    by = {r.scenario: r for r in run_cells(cells, opts).records}
    skipped = by["fault_missing_package"]
    assert skipped.status == "skip" and not skipped.as_expected  # a skip the scenario does not declare
    assert skipped.missing == "Python package(s) no_such_package_fsdp_compat"
    assert "no_such_package_fsdp_compat" in skipped.reason and "json" not in skipped.reason
    assert by["fault_after"].status == "pass" and by["fault_after"].launch_id == skipped.launch_id


_LEAKY_PATCHES = '''
import os, subprocess, sys, threading, time

DAEMON = "import os, sys, time\\nif os.fork():\\n    os._exit(0)\\nos.setsid()\\n" \\
         "open(sys.argv[1], 'a').write(f'{os.getpid()}\\\\n')\\ntime.sleep(300)\\n"


def patch_chaos_noop():
    pids = os.path.join(os.environ["FSDP_COMPAT_TEST_PIDS"], f"{os.getpid()}.pids")  # one file per rank
    sleeper = subprocess.Popen(["sleep", "300"])
    with open(pids, "a") as f:
        f.write(f"{sleeper.pid}\\n")
    subprocess.Popen([sys.executable, "-c", DAEMON, pids]).wait()  # forks, leaves its session, is orphaned
    deadline = time.time() + 30
    while open(pids).read().count("\\n") < 2 and time.time() < deadline:  # the daemon noted its pid
        time.sleep(0.05)
    threading.Thread(target=time.sleep, args=(10**6,)).start()  # not a daemon thread
'''


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_what_a_patch_starts_does_not_outlive_the_run(tmp_path):
    """A patch starts a child, a daemon that leaves its session, and a thread that never ends:
    the run ends in bounded time with its cells recorded, and neither process is left."""
    patches, pids = tmp_path / "leaky_patches.py", tmp_path / "pids"
    patches.write_text(_LEAKY_PATCHES)
    pids.mkdir()
    out = tmp_path / "r.jsonl"
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--scenarios-dir", str(ROOT / "tests/fixtures/chaos"),
                          "--scenario", "chaos_0", "--world-size", "1", "--world-size", "2", "--variant", "patched",
                          "--patches", str(patches), "--timeout", "20", "--out", str(out), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FSDP_COMPAT_TEST_PIDS": str(pids)})
    wall = time.time() - t0
    started = [int(x) for f in pids.iterdir() for x in f.read_text().split()]
    left = [pid for pid in started if _alive(pid)]
    for pid in left:  # nothing of this test stays behind, whatever the harness did
        os.kill(pid, signal.SIGKILL)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert res.returncode in (0, 1), res.stderr
    assert sorted(r["world_size"] for r in records) == [1, 2] and {r["status"] for r in records} <= {"pass", "error"}
    assert started and len(started) % 2 == 0  # per install: the sleep and the daemon
    assert left == []
    assert wall < 120


@pytest.mark.parametrize("how", ["__import__('os')._exit(0)", "__import__('ctypes').CDLL(None).exit(0)"])
def test_a_patch_that_ends_its_rank_names_the_rank_the_exit_code_and_the_phase(tmp_path, how):
    """``os._exit`` is noted by the rank itself; a C-level ``exit`` is read from torchrun's
    summary (every rank exited 0) and the rank's phase file."""
    patches = tmp_path / "exiting_patches.py"
    patches.write_text(f"def patch_chaos_noop():\n    {how}\n")
    out = tmp_path / "r.jsonl"
    subprocess.run([sys.executable, "-m", "harness", "run", "--scenarios-dir", str(ROOT / "tests/fixtures/chaos"),
                    "--scenario", "chaos_0", "--world-size", "1", "--variant", "patched", "--patches", str(patches),
                    "--timeout", "20", "--out", str(out), "--quiet"], cwd=ROOT, capture_output=True, timeout=300)
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (rec["status"], rec["exc_type"], rec["failing_rank"]) == ("crash", "ExitCode", 0)
    assert rec["exc_msg"] == "rank 0 exited with code 0 during install of patch chaos_noop"
