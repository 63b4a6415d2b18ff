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


def _script() -> list[str]:
    """The ``fsdp-compat`` console script of this interpreter's install (``python -m harness`` without one)."""
    from pathlib import Path

    script = Path(sys.executable).parent / "fsdp-compat"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "harness"]


def _third_party_repo(root):
    """Another team's repository: patches inside its package (importing the rest of it, names of
    their own) and a folder of its own scenarios, a package named ``scenarios`` like the project's."""
    pkg = root / "acme_train"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text("ENABLED = True\n")
    (pkg / "fsdp_patches.py").write_text(
        "from acme_train.settings import ENABLED\n\n__version__ = '0.3.1'\n\n\n"
        "def restore_params_nobody_used():\n    return None\n")
    (root / "scenarios").mkdir()
    (root / "scenarios" / "__init__.py").write_text("")
    (root / "scenarios" / "acme_tiny.py").write_text(
        '"""acme: a two-layer MLP."""\n\nfrom harness.spec import Scenario\nfrom scenarios._models import MLP, randn_batch\n\n'
        "SCENARIO = Scenario(model=lambda: MLP((7, 5, 3)), batch=randn_batch(), world_sizes=(1,),\n"
        '                    patches=("restore_unused_param_grads",))\n')


@pytest.mark.slow
def test_run_and_report_from_another_repository(tmp_path):
    """From a folder outside the project: the project's scenarios (not the folder's own
    ``scenarios`` package) and the user's folder, a patches module importable only from that
    folder (named with --patch-map), then the report."""
    repo = tmp_path / "acme"
    _third_party_repo(repo)
    cmd = _script()
    res = subprocess.run([*cmd, "run", "--patches", "acme_train.fsdp_patches",
                          "--patch-map", "restore_unused_param_grads=restore_params_nobody_used",
                          "--scenarios-dir", "scenarios", "--scenario", "plain", "--scenario", "acme_tiny",
                          "--world-size", "1", "--variant", "vanilla", "--variant", "patched", "--variant", "deployed",
                          "--quiet"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (records_file,) = (repo / "runs").glob("*.jsonl")
    records = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert {(r["scenario"], r["variant"], r["status"]) for r in records} == {
        ("plain", "vanilla", "pass"), ("plain", "deployed", "pass"), ("acme_tiny", "vanilla", "pass"),
        ("acme_tiny", "patched", "pass"), ("acme_tiny", "deployed", "pass")}
    patched = next(r for r in records if r["variant"] == "patched")
    assert patched["patch_install"]["restore_unused_param_grads"]["status"] == "installed"
    rep = subprocess.run([*cmd, "report"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    md = (repo / "reports" / "compat.md").read_text()
    assert "Patches module under test: acme_train.fsdp_patches 0.3.1 (sha256 " in md
    assert str(tmp_path) not in md  # the report names the module, never where it lay


@pytest.mark.slow
def test_a_relative_patches_file_works_from_another_folder(tmp_path):
    (tmp_path / "my_patches.py").write_text("def patch_fsdp_restore_unused_param_grads():\n    return None\n")
    res = subprocess.run([sys.executable, "-m", "harness", "run", "--patches", "my_patches.py", "--scenario",
                          "e_globally_unused_adamw", "--world-size", "1", "--variant", "patched", "--out", "r.jsonl",
                          "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    (rec,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rec["patch_install"]["restore_unused_param_grads"]["status"] == "installed", res.stdout + res.stderr


def test_workers_get_the_caller_s_module_by_absolute_path_or_import_root(tmp_path, monkeypatch):
    from harness.undertest.locations import import_root, worker_spec

    _third_party_repo(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert worker_spec("acme_train/fsdp_patches.py", ROOT) == str(tmp_path / "acme_train" / "fsdp_patches.py")
    assert worker_spec("acme_train/fsdp_patches.py", tmp_path) == "acme_train/fsdp_patches.py"  # found there as given
    assert worker_spec("acme_train.fsdp_patches", ROOT) == "acme_train.fsdp_patches"
    assert import_root("acme_train.fsdp_patches") == tmp_path == import_root("acme_train")
    assert import_root("acme_train/fsdp_patches.py") is None and import_root("no_such.module") is None
    assert import_root("fsdp_patches", known=[str(ROOT)]) is None
    assert import_root("yaml") is None  # an installed package: already on the workers' path


@pytest.mark.parametrize("installed,wanted,ok", [("2.13.0+cpu", "2.13.0", True), ("2.16.0rc1", "2.16.0rc1", True),
                                                 ("2.16.0rc1+cu128", "2.16.0rc1", True), ("2.16.0", "2.16.0rc1", False),
                                                 ("2.16.0rc1", "2.16.0", False), ("2.13.0", "2.13", True)])
def test_expect_torch_tells_a_prerelease_from_its_release(monkeypatch, installed, wanted, ok):
    import importlib.metadata

    from harness.launch.pipeline import _check_torch

    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    if ok:
        _check_torch(wanted)
    else:
        with pytest.raises(ValueError, match=f"installed torch {installed} is not the requested {wanted}"):
            _check_torch(wanted)
