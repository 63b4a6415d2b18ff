"""The command line as a user runs it: bad input, baseline cells, determinism."""

import json
import subprocess
import sys

import pytest
import torch

from tests.support import ROOT


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--scenario", "no_such_scenario"], "error: unknown scenario 'no_such_scenario'"),
        (["run", "--scenario", "hsdp", "--world-size", "1"], "error: scenario 'hsdp' does not support world size 1"),
        (["run", "--scenario", "plain", "--device", "tpu"], "error: unknown device 'tpu'"),
        (["run", "--scenario", "plain", "--patches", "no_such.patches"], "error: patches module 'no_such.patches' cannot be imported"),
        (["run", "--scenario", "plain", "--patch-map", "oops"], "error: --patch-map expects NAME=FUNCTION"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = _cli(*args, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith(message)


def test_an_out_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    (tmp_path / "a_dir.jsonl").mkdir()
    cases = {
        "/proc/x/y.jsonl": "error: --out /proc/x/y.jsonl: cannot create the folder /proc/x: No such file or directory",
        str(a_file / "y.jsonl"): f"error: --out {a_file / 'y.jsonl'}: cannot create the folder {a_file}: "
                                 f"{a_file} is a file, not a folder",
        str(a_file / "sub" / "y.jsonl"): f"error: --out {a_file / 'sub' / 'y.jsonl'}: cannot create the folder "
                                         f"{a_file / 'sub'}: {a_file} is a file, not a folder",
        str(tmp_path / "a_dir.jsonl"): f"error: --out {tmp_path / 'a_dir.jsonl'}: cannot write it: Is a directory",
    }
    for out, message in cases.items():
        res = _cli("run", "--scenario", "plain", "--world-size", "1", "--variant", "vanilla", "--out", out, timeout=60)
        assert (res.returncode, res.stderr.strip()) == (2, message)


def test_list_shows_baseline_scenarios():
    out = _cli("list", timeout=60)
    assert out.returncode == 0
    names = {line.split()[0] for line in out.stdout.splitlines()}
    assert {"plain", "cpu_offload", "mixed_precision", "hsdp"} <= names


@pytest.mark.slow
def test_baseline_cells_pass_and_runs_are_bit_identical(tmp_path):
    dumps = []
    for i in range(2):
        out_file = tmp_path / f"r{i}.jsonl"
        dump = tmp_path / f"dump{i}"
        res = _cli("run", "--scenario", "plain", "--scenario", "mixed_precision", "--world-size", "2",
                   "--variant", "vanilla", "--out", str(out_file), "--dump", str(dump))
        assert res.returncode == 0, res.stdout + res.stderr
        records = [json.loads(line) for line in out_file.read_text().splitlines()]
        assert [r["status"] for r in records] == ["pass", "pass"]
        assert "2 cells: pass 2; 0 not as expected" in res.stdout
        dumps.append({p.name: torch.load(p) for p in sorted(dump.glob("*.pt"))})
    assert dumps[0].keys() == dumps[1].keys() and len(dumps[0]) == 2
    for name, steps in dumps[0].items():
        for a, b in zip(steps, dumps[1][name]):
            for field in ("grads", "params", "clipped"):
                for k, t in a[field].items():
                    assert (t is None) == (b[field][k] is None)
                    if t is not None:
                        assert torch.equal(t, b[field][k]), f"{name} {field} {k} differs between runs"


@pytest.mark.slow
def test_exit_code_says_whether_outcomes_were_expected(tmp_path):
    res = _cli("run", "--scenarios-dir", "tests/fixtures/scenarios", "--scenario", "fault_raise",
               "--scenario", "fault_unexpected", "--variant", "vanilla", "--out", str(tmp_path / "r.jsonl"))
    records = {r["scenario"]: r for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines())}
    assert records["fault_raise"]["status"] == "error" and records["fault_raise"]["as_expected"]
    assert records["fault_unexpected"]["status"] == "error" and not records["fault_unexpected"]["as_expected"]
    assert res.returncode == 1
    assert "UNEXPECTED" in res.stdout


def test_expect_torch_refuses_a_different_release():
    out = _cli("run", "--scenario", "plain", "--expect-torch", "2.1.0", timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("error: installed torch ") and out.stderr.strip().endswith("is not the requested 2.1.0")


def test_a_signal_while_the_summary_prints_exits_128_plus_n(monkeypatch, capsys):
    """After the launcher let go (every record on disk), SIGTERM still ends the command with
    143 and the summary finished, not with the default handler's death."""
    import os
    import signal

    import harness.console
    import harness.launch.pipeline as pipeline
    from harness.cli import main
    from harness.launch.launcher import RunResult

    monkeypatch.setattr(pipeline, "run", lambda req, **kw: RunResult(records=[], not_run=[]))

    def summary(records, *, shuffle=None):
        os.kill(os.getpid(), signal.SIGTERM)
        print("summary done")

    monkeypatch.setattr(harness.console, "print_summary", summary)
    assert main(["run", "--scenario", "plain", "--quiet"]) == 128 + signal.SIGTERM
    out = capsys.readouterr().out
    assert "summary done" in out and "interrupted by SIGTERM" in out
