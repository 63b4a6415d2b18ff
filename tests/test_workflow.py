"""The GPU workflow is valid YAML and its job list comes from nox's JSON session list."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "gpu-matrix.yml"


def test_workflow_structure():
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert set(wf["jobs"]) == {"plan", "matrix", "report"}
    runs = [step.get("run", "") for step in wf["jobs"]["report"]["steps"]]
    previous = next(i for i, r in enumerate(runs) if "gh run download" in r)
    assert previous < runs.index("nox -s report")
    matrix = wf["jobs"]["matrix"]
    assert matrix["strategy"]["matrix"]["session"] == "${{ fromJSON(needs.plan.outputs.sessions) }}"
    assert any(step.get("run") == 'nox -s "${{ matrix.session }}"' for step in matrix["steps"])
    report_runs = [step.get("run", "") for step in wf["jobs"]["report"]["steps"]]
    assert "nox -s report" in report_runs
    assert any("GITHUB_STEP_SUMMARY" in r for r in report_runs)


def test_plan_step_lists_the_cuda_matrix_sessions(tmp_path):
    wf = yaml.safe_load(WORKFLOW.read_text())
    (step,) = [s for s in wf["jobs"]["plan"]["steps"] if s.get("id") == "list"]
    output = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(output)}
    res = subprocess.run(["bash", "-ec", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    key, _, value = output.read_text().strip().partition("=")
    sessions = json.loads(value)
    assert key == "sessions"
    assert "matrix(torch='2.13.0', device='cuda')" in sessions
    assert all("device='cuda'" in s for s in sessions)
    sys.path.insert(0, str(ROOT))
    from harness.envs.matrix import load_matrix

    assert len(sessions) == len(load_matrix(ROOT / "matrix.yaml").device("cuda").torch)


def _summary_step():
    wf = yaml.safe_load(WORKFLOW.read_text())
    (step,) = [s for s in wf["jobs"]["report"]["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    return step["run"]


def _fake_nox(tmp_path):
    """``nox -s diff -- ARGS`` as ``python -m harness diff ARGS``, ``nox -s prerelease -- ARGS`` as
    ``python -m harness prerelease --records runs/matrix ARGS`` (no venv to build in a test)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nox = bin_dir / "nox"
    harness = f"PYTHONPATH={ROOT} exec {sys.executable} -m harness"
    nox.write_text(f'#!/bin/sh\ncase "$1 $2 $3" in\n'
                   f'  "-s diff --") shift 3; {harness} diff "$@";;\n'
                   f'  "-s prerelease --") shift 3; {harness} prerelease --records runs/matrix "$@";;\n'
                   f'  *) exit 9;;\nesac\n')
    nox.chmod(0o755)
    return bin_dir


def _run_summary_step(tmp_path, *, timeout, worse=False):
    """The workflow's summary step in ``tmp_path`` with a stand-in nox; (its result, the summary file).
    It fails exactly when the matrix got worse since the last successful run (``worse``)."""
    summary = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "PATH": f"{_fake_nox(tmp_path)}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-ec", _summary_step()], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == (1 if worse else 0), res.stderr
    return res, summary


@pytest.mark.parametrize("worse", [False, True])
def test_the_summary_puts_what_changed_since_the_last_run_first(tmp_path, worse):
    from harness.results.report import build_report
    from tests.test_diff import _cell, _run

    old = build_report([_run(tmp_path, "old", _cell("2.14.1", "error"))], tmp_path / "previous")
    new_cell = _cell("2.14.1", "error", "mismatch") if worse else _cell("2.14.1", "pass")
    build_report([_run(tmp_path, "runs/matrix", new_cell)], tmp_path / "reports")
    assert old["csv"] == tmp_path / "previous" / "compat.csv"
    res, summary = _run_summary_step(tmp_path, timeout=120, worse=worse)
    text = summary.read_text()
    assert text.startswith("## Changes:")
    assert text.index("## Changes:") < text.index((tmp_path / "reports" / "compat.md").read_text().splitlines()[0])
    assert ("::error::the GPU matrix got worse" in res.stdout) == worse
    assert ("### Got worse" in text) == worse and ("### Newly fixed upstream" in text) != worse


def test_the_summary_says_when_there_is_no_previous_run(tmp_path):
    from harness.results.report import build_report
    from tests.test_diff import _cell, _run

    build_report([_run(tmp_path, "runs/matrix", _cell("2.14.1", "pass"))], tmp_path / "reports")
    _, summary = _run_summary_step(tmp_path, timeout=60)
    assert summary.read_text().startswith("No earlier successful run to compare with.")


@pytest.mark.parametrize("worse", [False, True])
def test_the_summary_puts_the_prerelease_lane_first_when_the_records_have_one(tmp_path, worse):
    """A pre-release torch among the records: newest stable -> candidate comes before the run-to-run diff."""
    from harness.results.report import build_report
    from tests.test_diff import _cell, _run

    build_report([_run(tmp_path, "old", _cell("2.15.0", "error"))], tmp_path / "previous")
    candidate = _cell("2.16.0rc1", "error", "mismatch") if worse else _cell("2.16.0rc1", "pass")
    for rec in candidate:
        rec["env"] = {"torch_source": "find-links ./rc-wheels; pre-releases allowed"}
    records = _run(tmp_path, "runs/matrix", [*_cell("2.14.1", "error"), *_cell("2.15.0", "error"), *candidate])
    build_report([records], tmp_path / "reports")
    res, summary = _run_summary_step(tmp_path, timeout=120)  # a candidate that got worse warns; it does not fail
    text = summary.read_text()
    assert text.startswith("# Pre-release lane\n")
    lane = text.split("## Changes: previous/compat.csv")[0]
    assert "## Changes: newest stable release on cpu (torch 2.15.0) → pre-release on cpu, from find-links " \
           "./rc-wheels; pre-releases allowed (torch 2.16.0rc1)" in lane
    assert ("s w2 on torch 2.15.0 → 2.16.0rc1 (cpu): patch needed → patch broken" in lane) == worse
    assert ("s w2 on torch 2.15.0 → 2.16.0rc1 (cpu): patch needed → fixed upstream" in lane) != worse
    assert ("pre-release torch got worse" in res.stdout) == worse
    assert "| 2.16.0rc1 (pre-release)" in text  # the report's columns, after the diffs
