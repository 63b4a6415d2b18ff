"""The GPU workflow is valid YAML and its job list comes from nox's JSON session list."""

import json
import os
import subprocess

import yaml

from tests.conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "gpu-matrix.yml"


def test_workflow_structure():
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert set(wf["jobs"]) == {"plan", "matrix", "report"}
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
    import sys

    sys.path.insert(0, str(ROOT))
    from harness.matrix import load_matrix

    assert len(sessions) == len(load_matrix(ROOT / "matrix.yaml").device("cuda").torch)
