"""A run's plan is saved by what it was made from (``harness.plan.saved``) and taken again,
without loading a scenario, only while every one of those inputs is unchanged."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness.scenario.load
from harness.launch import pipeline
from harness.plan import saved
from harness.runconfig import RunConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _as_a_run_process_sees_it(monkeypatch):
    """Loading the hf_ scenarios sets these (``scenarios/_hf.py``): a run's process computes its
    plan's key before it loads them, a test planning twice in one process sees them set."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _folders(tmp_path: Path, monkeypatch=None) -> tuple[Path, Path]:
    scenarios, patches = tmp_path / "mine", tmp_path / "my_patches"
    scenarios.mkdir()
    (scenarios / "my_plain.py").write_text((ROOT / "scenarios" / "plain.py").read_text()
                                           + "from _sizes import SIZES\nSCENARIO.world_sizes = SIZES\n")
    (scenarios / "_sizes.py").write_text("SIZES = (1, 2)\n")
    shutil.copytree(ROOT / "fsdp_patches", patches, ignore=shutil.ignore_patterns("__pycache__"))
    if monkeypatch is not None:  # the helper beside the scenario, importable as a user's folder on the path is
        monkeypatch.syspath_prepend(str(scenarios))
    return scenarios, patches


def _config(tmp_path: Path, folder: Path, patches: Path, **kw) -> RunConfig:
    return RunConfig(**{"scenarios": ["plain", "my_plain"], "scenario_dirs": [str(folder)],
                        "patches": str(patches), "out": tmp_path / "runs" / "r.jsonl", **kw})


def _loads(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = harness.scenario.load.load_scenarios
    monkeypatch.setattr(harness.scenario.load, "load_scenarios", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def plan(config: RunConfig, saved_beside: Path | None = None):
    """``pipeline.plan``, and its plan kept as ``pipeline.run`` keeps it once it may write."""
    planned = pipeline.plan(config, saved_beside=saved_beside)
    if saved_beside is not None:
        pipeline._save(planned, saved_beside)
    return planned


def _cells(planned) -> list[dict]:
    return [dataclasses.asdict(c) for c in planned.cells]


def test_a_saved_plan_is_taken_again_without_loading_a_scenario_and_is_the_plan_it_saved(tmp_path, monkeypatch):
    scenarios, patches = _folders(tmp_path, monkeypatch)
    config = _config(tmp_path, scenarios, patches)
    loads = _loads(monkeypatch)
    first = plan(config, saved_beside=config.records_file)
    again = plan(config, saved_beside=config.records_file)
    assert len(loads) == 1 and len(list(saved.folder(config.records_file).glob("*.json"))) == 1
    assert _cells(again) == _cells(first) and all(c.inputs for c in again.cells)
    assert (again.module_id, again.module_path, again.warnings) == (first.module_id, first.module_path, first.warnings)
    # another records file, another run id, other records to reuse: the same plan
    moved = dataclasses.replace(config, run_id="other", reuse_from=[str(tmp_path / "old.jsonl")])
    assert _cells(plan(moved, saved_beside=config.records_file)) == _cells(first) and len(loads) == 1
    plan(dataclasses.replace(config, fresh=True), saved_beside=config.records_file)  # --fresh plans from scratch
    assert len(loads) == 2
    plan(config)  # the pytest plugin's plan: neither read nor saved
    assert len(loads) == 3


def test_every_input_of_a_plan_changes_its_key_and_a_changed_input_is_planned_again(tmp_path, monkeypatch):
    scenarios, patches = _folders(tmp_path, monkeypatch)
    config = _config(tmp_path, scenarios, patches)
    base = saved.plan_key(config)
    assert base is not None and saved.plan_key(config) == base

    def differs(label: str, edit, undo) -> None:
        edit()
        try:
            assert saved.plan_key(config) != base, label
        finally:
            undo()
        assert saved.plan_key(config) == base, label

    def rewrite(path: Path, text: str):
        old = path.read_text()
        return (lambda: path.write_text(text), lambda: path.write_text(old))

    differs("a scenario file", *rewrite(scenarios / "my_plain.py", (scenarios / "my_plain.py").read_text() + "#\n"))
    differs("a helper it imports", *rewrite(scenarios / "_sizes.py", "SIZES = (1, 2, 4)\n"))
    new = scenarios / "another.py"
    differs("a new scenario file", lambda: new.write_text("X = 1\n"), lambda: new.unlink())
    differs("a patch file", *rewrite(patches / "grads.py", (patches / "grads.py").read_text() + "#\n"))
    data = patches / "notes.txt"
    differs("a file in the patches folder", lambda: data.write_text("x"), lambda: data.unlink())
    # what a cell's key holds of the module besides its own files: a file outside it that it imports
    helper = tmp_path / "my_fixes.py"
    helper.write_text("LIMIT = 1\n")
    init = patches / "__init__.py"
    init.write_text(init.read_text() + "from my_fixes import LIMIT  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = saved.plan_key(config)
    differs("a file outside the module that it imports", *rewrite(helper, "LIMIT = 2\n"))
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    assert saved.plan_key(config) != base
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES")
    for option in (dict(timeout_s=45.0), dict(world_sizes=[1]), dict(variants=["vanilla"]), dict(init="meta"),
                   dict(patch_mapping={"gloo_avg_sum": "clip_grad_norm_"}), dict(devices=["cpu", "cuda"])):
        assert saved.plan_key(dataclasses.replace(config, **option)) != base, option

    # planned again after an edit (that the new plan holds what the edit says needs a new process:
    # tests/test_incremental.py's runs, where an edited scenario's cells, and only those, run again)
    loads = _loads(monkeypatch)
    plan(config, saved_beside=config.records_file)
    plan(config, saved_beside=config.records_file)
    (scenarios / "_sizes.py").write_text("SIZES = (1, 2, 4)\n")
    plan(config, saved_beside=config.records_file)
    assert len(loads) == 2


def test_a_plan_whose_scenario_failed_to_load_is_not_saved_and_the_oldest_plans_go(tmp_path, monkeypatch):
    scenarios, patches = _folders(tmp_path, monkeypatch)
    (scenarios / "broken.py").write_text("raise RuntimeError('not today')\n")
    config = _config(tmp_path, scenarios, patches, scenarios=["plain", "broken"])
    planned = plan(config, saved_beside=config.records_file)
    assert planned.broken and not saved.folder(config.records_file).exists()
    (scenarios / "broken.py").unlink()
    config = dataclasses.replace(config, scenarios=["plain"])
    monkeypatch.setattr(saved, "KEEP", 2)
    for timeout in (40.0, 41.0, 42.0):
        plan(dataclasses.replace(config, timeout_s=timeout), saved_beside=config.records_file)
    kept = list(saved.folder(config.records_file).glob("*.json"))
    assert len(kept) == 2
    assert {json.loads(p.read_text())["cells"][0]["timeout_s"] for p in kept} == {41.0, 42.0}


def test_the_parent_package_of_a_dotted_module_is_in_the_key(tmp_path, monkeypatch):
    scenarios, _ = _folders(tmp_path, monkeypatch)
    package = tmp_path / "site" / "acme"
    shutil.copytree(ROOT / "fsdp_patches", package / "fixes", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config = _config(tmp_path, scenarios, "acme.fixes")
    base = saved.plan_key(config)
    (package / "__init__.py").write_text("VERSION = 2\n")
    assert base is not None and saved.plan_key(config) not in (None, base)


def test_a_plan_is_kept_only_where_its_inputs_did_not_move_while_it_was_made_and_taking_one_writes_nothing(
        tmp_path, monkeypatch):
    scenarios, patches = _folders(tmp_path, monkeypatch)
    config = _config(tmp_path, scenarios, patches)
    real, keys = saved.plan_key, iter(["before", "after"])
    monkeypatch.setattr(saved, "plan_key", lambda *a: next(keys))  # an edit while the scenarios loaded
    assert pipeline.plan(config, saved_beside=config.records_file).to_save is None
    monkeypatch.setattr(saved, "plan_key", real)
    plan(config, saved_beside=config.records_file)
    (path,) = saved.folder(config.records_file).glob("*.json")
    before = path.stat().st_mtime_ns
    taken = pipeline.plan(config, saved_beside=config.records_file)  # a held run: nothing written yet
    assert taken.taken and path.stat().st_mtime_ns == before
    pipeline._save(taken, config.records_file)  # let go: marked used
    assert path.stat().st_mtime_ns > before


@pytest.mark.parametrize("damage", ["truncated", "another key", "a list", "null", "cells of numbers"])
def test_a_damaged_saved_plan_is_planned_again(tmp_path, monkeypatch, damage):
    scenarios, patches = _folders(tmp_path, monkeypatch)
    config = _config(tmp_path, scenarios, patches)
    first = plan(config, saved_beside=config.records_file)
    (path,) = saved.folder(config.records_file).glob("*.json")
    text = path.read_text()
    path.write_text({"truncated": text[:len(text) // 2], "another key": text.replace('"key": "', '"key": "x', 1),
                     "a list": "[]", "null": "null",
                     "cells of numbers": json.dumps({**json.loads(text), "cells": [1]})}[damage])
    loads = _loads(monkeypatch)
    assert _cells(plan(config, saved_beside=config.records_file)) == _cells(first) and len(loads) == 1


def test_a_run_that_takes_its_saved_plan_never_imports_torch_before_its_launch(tmp_path, monkeypatch):
    """``harness run``'s own process, its plan saved and every cell answered by a record: no torch.
    Started as from a shell that sets none of the switches loading the hf_ scenarios sets: the
    plan is kept although planning changed the process's environment."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    out = tmp_path / "r.jsonl"
    probe = ("import sys; from harness.cli import main; code = main(sys.argv[1:]); "
             "print('torch' in sys.modules); sys.exit(code)")
    cmd = [sys.executable, "-c", probe, "run", "--quiet", "--out", str(out), "--world-size", "1",
           "--scenario", "plain", "--scenario", "hf_llama_tied", "--variant", "vanilla"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert first.stdout.strip().splitlines()[-1] == "True"  # it planned: every scenario file loaded
    again = subprocess.run([*cmd, "--reuse-from", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == "False"
