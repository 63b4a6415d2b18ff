"""Local reproduction, the standalone export, and a third-party patches module."""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def _cli(*args, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _torch_only_python(tmp_path: Path) -> str:
    """A venv that sees torch (through a .pth line) but not this project."""
    import torch

    env_dir = tmp_path / "torch-only"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = next(env_dir.glob("lib/python*/site-packages"))
    torch_parent = Path(torch.__file__).resolve().parent.parent
    # only torch and what it imports, not the project's editable install beside it
    (site / "torch_only.pth").write_text(str(torch_parent) + "\n")
    return str(env_dir / "bin" / "python")


def test_repro_prints_verdict_traceback_and_rerun_and_export_runs_standalone(tmp_path):
    script = tmp_path / "repro_c.py"
    res = _cli("repro", "c_skipped_vision_tower", "--world-size", "1", "--export", str(script))
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "verdict: error (expected error, as expected)" in out
    assert "exception on rank 0: AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'" in out
    assert "to_accumulated_grad_if_needed" in out  # the failing rank's traceback
    assert "rerun: " in out and "repro c_skipped_vision_tower --world-size 1 --variant vanilla --device cpu" in out
    assert script.exists()

    python = _torch_only_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    probe = subprocess.run([python, "-c", "import torch, importlib.util as u; print(u.find_spec('harness'))"],
                           cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr  # the project is not importable there
    run = subprocess.run([python, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "EXPECTED (fsdp-compat" in run.stdout and "error with '_unsharded_param'" in run.stdout
    assert "OBSERVED: AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'" in run.stdout


def test_repro_diff_table_lists_the_worst_parameter_first(tmp_path):
    res = _cli("repro", "d2_hsdp_swapped_layers", "--world-size", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "verdict: mismatch (expected mismatch, as expected)" in res.stdout
    table = res.stdout.split("note\n", 1)[1].splitlines()
    assert "presence  a.weight" in table[0]  # a.weight: None on the FSDP side, the reference has a grad
    assert "NO" in table[0]


def test_third_party_module_is_judged_needed_and_broken(tmp_path):
    out = tmp_path / "r.jsonl"
    res = _cli("run", "--scenario", "c_skipped_vision_tower", "--scenario", "b2_mixed_dtype_late_param",
               "--world-size", "1", "--patches", "tests/fixtures/third_party_patches.py",
               "--patch-map", "accumulated_grad_guard=patch_guard_missing_unsharded",
               "--patch-map", "uniform_reduce_dtype=patch_widen_grads", "--out", str(out), "--quiet")
    records = {(r["scenario"], r["variant"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert records[("c_skipped_vision_tower", "patched")]["status"] == "pass"
    assert records[("b2_mixed_dtype_late_param", "patched")]["status"] == "mismatch"
    assert res.returncode == 1  # the broken patch is an unexpected outcome

    from harness.results.tables import build_tables

    tables = build_tables([out])
    summary = {row.patch: row.status for row in tables.patches.itertuples()}
    assert summary["accumulated_grad_guard"] == "needed"
    assert summary["uniform_reduce_dtype"] == "broken"


def test_a_function_the_module_lacks_is_not_provided_and_the_rest_still_runs(tmp_path):
    out = tmp_path / "r.jsonl"
    _cli("run", "--scenario", "c_skipped_vision_tower", "--world-size", "1", "--variant", "patched",
         "--variant", "deployed", "--patches", "tests/fixtures/third_party_patches.py",
         "--patch-map", "uniform_reduce_dtype=patch_widen_grads", "--out", str(out), "--quiet")
    records = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    patched = records["patched"]
    assert patched["patch_install"]["accumulated_grad_guard"] == {
        "status": "not-provided", "reason": "tests/fixtures/third_party_patches.py has no "
                                            "patch_fsdp_accumulated_grad_guard or patch_accumulated_grad_guard"}
    # not run: without its patch it would be the vanilla cell again (and could end the launch)
    assert patched["status"] == "skip" and patched["as_expected"]
    assert patched["reason"] == "not provided by the module under test: accumulated_grad_guard"
    deployed = records["deployed"]
    assert deployed["patch_install"]["uniform_reduce_dtype"]["status"] == "installed"  # the others installed
    assert deployed["patch_install"]["unused_param_reduction"]["status"] == "not-provided"

    from harness.results.tables import build_tables

    tables = build_tables([out])
    assert tables.cells.iloc[0]["verdict"] == "not provided"
    summary = {row.patch: row.status for row in tables.patches.itertuples()}
    assert summary["accumulated_grad_guard"] == "not provided"
    assert tables.modules[0].startswith("third_party_patches.py (sha256 ")  # the file by name and hash, no path


def test_scenario_written_from_a_users_snippet_reproduces_and_is_fixed(tmp_path):
    out = tmp_path / "r.jsonl"
    res = _cli("run", "--scenarios-dir", "tests/fixtures/user_scenarios", "--scenario", "user_captioner_text_first",
               "--world-size", "1", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stdout + res.stderr
    records = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["vanilla"]["status"] == "error" and "_unsharded_param" in records["vanilla"]["exc_msg"]
    assert records["patched"]["status"] == "pass"
    listed = _cli("list", "--scenarios-dir", "tests/fixtures/user_scenarios").stdout
    assert "user_captioner_text_first" in listed


def test_the_exported_modules_import_only_each_other():
    """The standalone script carries HARNESS_MODULES; a harness module they import but the list
    lacks makes the export fail on a torch-only machine (seen: train.ledger, train.resources)."""
    import ast

    from harness.repro.export import HARNESS_MODULES

    carried = {f"harness.{m}" for m in HARNESS_MODULES}
    missing = set()
    for name in HARNESS_MODULES:
        tree = ast.parse((ROOT / "harness" / f"{name.replace('.', '/')}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
                targets = [f"{node.module}.{a.name}" for a in node.names]
                missing |= {node.module} - carried if node.module != "harness.train" else set()
                if node.module in ("harness", "harness.train"):
                    missing |= {t for t in targets if t not in carried}
    assert not missing, f"harness modules the export needs but does not carry: {sorted(missing)}"
