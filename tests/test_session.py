"""The body of ``nox -s matrix`` (harness/envs/session.py), run with a stand-in nox session."""

import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.envs.matrix import load_matrix
from harness.envs.session import bytecode_env, run_version, write_bytecode
from tests.support import ROOT

TORCH = str(torch.__version__).split("+")[0]


class Session:
    """What ``run_version`` uses of a nox session: installs go to a real venv (uv, offline; a
    package is built with the build backend this interpreter has, so an empty uv cache
    needs no index), commands run with its python."""

    def __init__(self, venv: Path, posargs=()):
        self.virtualenv = SimpleNamespace(location=str(venv))
        self.posargs = list(posargs)
        self.installs: list[list[str]] = []
        self.runs: list[tuple[list[str], dict]] = []
        self.install_runs: list[list[str]] = []  # commands of the install step (nox: also under --install-only)
        self.python = venv / "bin" / "python"

    def install(self, *args):
        from nox.command import CommandFailed

        self.installs.append(list(args))
        if not args:
            return
        res = subprocess.run(["uv", "pip", "install", "-q", "--offline", "--no-build-isolation", "--python",
                              str(self.python), *args],
                             capture_output=True, text=True, timeout=120)
        if res.returncode:
            raise CommandFailed(res.stderr)

    def run(self, program, *args, env=None, **_):
        self.runs.append(([program, *args], env))
        self.result = subprocess.run(self._command(program, args), env={**os.environ, **(env or {})}, capture_output=True, text=True,
                                     timeout=300)

    def run_install(self, program, *args, **_):
        self.install_runs.append([program, *args])
        subprocess.run(self._command(program, args), check=True, capture_output=True, timeout=300)

    def _command(self, program, args):
        return [str(self.python) if program == "python" else program, *args]

    def skip(self, message):
        pytest.skip(message)

    def error(self, message):
        raise AssertionError(message)


class Recorder(Session):
    """A session that only records what it would install and run."""

    def install(self, *args):
        self.installs.append(list(args))

    def run(self, program, *args, env=None, **_):
        self.runs.append(([program, *args], env))

    def run_install(self, program, *args, **_):
        self.install_runs.append([program, *args])


def _stack(tmp_path: Path) -> Path:
    """Another team's repository: a package (its patches inside, importing the rest of it), a
    scenario folder whose scenario imports that package, and a matrix file naming both."""
    repo = tmp_path / "acme"
    pkg = repo / "pkg" / "acme_marker"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("WIDTH = 9\n")
    (pkg / "fsdp_patches.py").write_text(
        '"""acme\'s patches."""\n\nfrom acme_marker import WIDTH\n\n__version__ = "0.1"\n\n\n'
        "def patch_fsdp_restore_unused_param_grads():\n    return None\n")
    (repo / "pkg" / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                                 'build-backend = "setuptools.build_meta"\n'
                                                 '[project]\nname = "acme-marker"\nversion = "0.1"\n')
    (repo / "cases").mkdir()
    (repo / "cases" / "acme_wide_mlp.py").write_text(
        '"""acme: an MLP as wide as acme_marker says, a unit per layer."""\n\n'
        "from acme_marker import WIDTH\n\nfrom harness.spec import Scenario, Sharding\n"
        "from scenarios._models import MLP, randn_batch\n\n"
        "SCENARIO = Scenario(model=lambda: MLP((7, WIDTH, 3)), batch=randn_batch(), world_sizes=(1,),\n"
        '                    sharding=Sharding(units=("layers.0", "layers.1")))\n')
    (repo / "fsdp-compat.yaml").write_text(
        "patches: acme_marker.fsdp_patches\ninstall: [./pkg]\nscenarios_dirs: [cases]\nscenarios: [acme_wide_mlp]\n"
        f"world_sizes: [1]\ntimeout_s: 60\ndevices:\n  cpu:\n    torch: ['{TORCH}']\n")
    return repo / "fsdp-compat.yaml"


@pytest.mark.slow
def test_the_matrix_session_installs_the_stack_and_runs_its_scenarios(tmp_path, monkeypatch):
    """``install:`` (a local package) and ``scenarios_dirs:`` (a folder made here) from a matrix
    file elsewhere: the package is installed into the venv (editable), the run finds the folder's
    scenario, which imports the package, and the package's patches module."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    t0 = time.monotonic()
    matrix = load_matrix(_stack(tmp_path))
    venv = tmp_path / "venv"
    # the venv sees this interpreter's torch and the harness's packages (a .pth naming its
    # site-packages: --system-site-packages would name the base interpreter's when this one is
    # itself a venv, as under nox); uv installs the rest into it
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=60)
    inner = next(venv.glob("lib/python*/site-packages"))
    (inner / "_outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    monkeypatch.setattr("harness.envs.session.torch_install_args", lambda *a, **k: [])  # torch: the one it sees
    runs = tmp_path / "runs"
    session = Session(venv)
    run_version(session, matrix, TORCH, "cpu", root=ROOT, runs=runs)
    assert session.installs == [[], ["-e", str(tmp_path / "acme" / "pkg")]]
    (cmd, env), = session.runs
    assert cmd[:4] == ["python", "-m", "harness", "run"]
    assert cmd[cmd.index("--scenarios-dir") + 1] == str(tmp_path / "acme" / "cases")
    assert cmd[cmd.index("--patches") + 1] == "acme_marker.fsdp_patches"
    assert env == {"PYTHONPATH": str(ROOT), **bytecode_env(venv / ".fsdp-compat")}
    assert session.result.returncode == 0, session.result.stdout[-3000:] + session.result.stderr[-3000:]
    records = [json.loads(line) for line in (runs / "cpu" / f"torch-{TORCH}.jsonl").read_text().splitlines()]
    assert {(r["scenario"], r["variant"], r["status"]) for r in records} == {
        ("acme_wide_mlp", "vanilla", "pass"), ("acme_wide_mlp", "deployed", "pass")}
    deployed = next(r for r in records if r["variant"] == "deployed")
    assert deployed["patches_module"] == "acme_marker.fsdp_patches"
    assert deployed["patch_install"]["restore_unused_param_grads"]["status"] == "installed"
    print(f"matrix session with install: and scenarios_dirs: {time.monotonic() - t0:.1f} s")


def test_a_source_entry_is_stamped_on_the_run_and_a_rerun_keeps_other_versions(tmp_path, monkeypatch):
    """The pre-release lane's cell: torch from its own source (the install arguments carry it),
    the run's environment names it; a rerun of 2.16.0rc1 leaves 2.16.0's records alone."""
    (tmp_path / "rc").mkdir()
    (tmp_path / "m.yaml").write_text("devices:\n  cpu:\n    torch:\n      - {version: '2.16.0rc1', find_links: rc, "
                                     "pre: true}\n")
    matrix = load_matrix(tmp_path / "m.yaml")
    runs = tmp_path / "runs"
    (runs / "cpu").mkdir(parents=True)
    for name in ("torch-2.16.0.jsonl", "torch-2.16.0rc1.jsonl", "torch-2.16.0rc1-gw0.jsonl"):
        (runs / "cpu" / name).write_text("")

    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    session = Recorder(tmp_path / "venv", posargs=["--config", "m.yaml", "--shuffle", "3"])
    run_version(session, matrix, "2.16.0rc1", "cpu", root=ROOT, runs=runs)
    torch_args = session.installs[0]
    assert torch_args[0] == "torch==2.16.0rc1" and "--prerelease" in torch_args
    assert torch_args[torch_args.index("--find-links") + 1] == str(tmp_path / "rc")
    (cmd, env), = session.runs
    assert env["FSDP_COMPAT_TORCH_SOURCE"] == "find-links rc; pre-releases allowed"
    assert cmd[-2:] == ["--shuffle", "3"] and "--config" not in cmd
    assert cmd[cmd.index("--expect-torch") + 1] == "2.16.0rc1"
    assert sorted(p.name for p in (runs / "cpu").iterdir()) == ["torch-2.16.0.jsonl"]


def test_the_committed_matrix_runs_as_before(tmp_path, monkeypatch):
    """matrix.yaml's cells: torch, then the hf_ pack's transformers, nothing else installed; the
    same run command as before ``install``/``scenarios_dirs``/sources existed."""
    from harness.envs.packages import torch_install_args

    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    matrix = load_matrix(ROOT / "matrix.yaml")
    session = Recorder(tmp_path / "venv")
    run_version(session, matrix, "2.12.1", "cpu", root=ROOT, runs=tmp_path / "runs")
    out = tmp_path / "runs" / "cpu" / "torch-2.12.1.jsonl"
    assert session.installs == [torch_install_args("2.12.1", "cpu", tmp_path / "venv" / ".fsdp-compat"),
                                ["transformers==5.24.0"]]
    assert session.runs == [(["python", "-m", "harness", "run", "--device", "cpu", "--out", str(out), "--patches",
                              "fsdp_patches", "--timeout", "60.0", "--expect-torch", "2.12.1", "--world-size", "1",
                              "--world-size", "2", "--world-size", "4", "--slots", "2"],
                             {"PYTHONPATH": str(ROOT), **bytecode_env(tmp_path / "venv" / ".fsdp-compat")})]


def test_the_cpu_slots_of_the_matrix_reach_the_run(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text("devices:\n  cpu:\n    torch: ['2.12.1']\n    slots: 2\n")
    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    session = Recorder(tmp_path / "venv")
    run_version(session, load_matrix(tmp_path / "m.yaml"), "2.12.1", "cpu", root=ROOT, runs=tmp_path / "runs")
    (cmd, _), = session.runs
    assert cmd[cmd.index("--slots") + 1] == "2"


def test_a_rerun_of_a_version_reuses_what_the_records_it_replaces_held(tmp_path, monkeypatch):
    from tests.support import make_record

    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    matrix = load_matrix(ROOT / "matrix.yaml")
    out = tmp_path / "runs" / "cpu" / "torch-2.12.1.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(make_record(inputs="k1", status="pass", as_expected=True).to_json() + "\n")
    session = Recorder(tmp_path / "venv")
    run_version(session, matrix, "2.12.1", "cpu", root=ROOT, runs=tmp_path / "runs")
    (cmd, _), = session.runs
    previous = out.with_name(out.name + ".previous")
    assert not out.exists() and cmd[cmd.index("--reuse-from") + 1] == str(previous)
    assert "k1" in previous.read_text()


def test_bytecode_is_written_once_per_set_of_installs_by_one_process(tmp_path):
    """uv installs without bytecode; the session imports what a launch imports once, in one
    process, and notes for which installs, so a rerun with the same installs does not again."""
    folder = tmp_path / "venv" / ".fsdp-compat"
    session = Recorder(folder.parent)
    calls = []
    session.run_install = lambda *args, **kw: calls.append((args, kw))
    assert write_bytecode(session, folder, "torch==2.13.0", root=ROOT, scenario_dirs=["cases"])
    (args, kw), = calls
    assert args == ("python", "-m", "harness.envs.warm", "cases")
    assert kw["env"] == {"PYTHONPATH": str(ROOT), **bytecode_env(folder)}
    assert (folder / "bytecode-written").read_text() == "torch==2.13.0"
    assert not write_bytecode(session, folder, "torch==2.13.0", root=ROOT) and len(calls) == 1
    assert write_bytecode(session, folder, "torch==2.13.0 transformers==4.57.1", root=ROOT) and len(calls) == 2


def test_the_bytecode_goes_to_the_venvs_folder_even_where_writing_it_is_off(tmp_path):
    """Under ``bytecode_env`` a process writes its modules' bytecode into the venv's folder
    (not next to the sources: the checkout stays clean), although the caller set
    PYTHONDONTWRITEBYTECODE; the next process reads it instead of compiling."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "acme_mod.py").write_text("VALUE = 1\n")
    folder = tmp_path / "venv" / ".fsdp-compat"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(src), **bytecode_env(folder)}
    code = "import acme_mod, sys; print(acme_mod.__cached__, sys.dont_write_bytecode)"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cached, dont_write = first.stdout.split()
    assert dont_write == "False" and Path(cached).is_file() and Path(cached).is_relative_to(folder)
    assert not (src / "__pycache__").exists()
    off = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                         capture_output=True, text=True, check=True)
    assert off.stdout.split()[1] == "True"  # the check can fail: the variable does switch writing off


@pytest.mark.slow
def test_the_warm_up_imports_what_a_launch_imports(tmp_path):
    """``harness.envs.warm`` in one process: torch's distributed stack, dynamo, the harness's
    per-rank modules and every scenario's requirements end up with bytecode in the folder."""
    folder = tmp_path / ".fsdp-compat"
    out = subprocess.run([sys.executable, "-m", "harness.envs.warm"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **bytecode_env(folder)}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("warm: ") and " modules imported in " in out.stdout
    written = {p.name for p in (folder / "pycache").rglob("*.pyc")}
    for module in ("worker", "_fully_shard", "eval_frame", "modeling_llama"):
        assert any(name.startswith(module + ".") for name in written), module


@pytest.mark.parametrize("named", [False, True])
def test_a_cuda_session_without_a_gpu_is_an_error_when_named_and_left_out_of_the_whole_matrix(tmp_path, monkeypatch,
                                                                                                named):
    """The GPU workflow names each cuda session: on a runner without a GPU that must fail, not
    pass as skipped. ``nox -s matrix`` on a laptop leaves the cuda sessions out with the reason."""
    from harness.envs import session as sessions
    from harness.envs.matrix import load_matrix

    name = "matrix(torch='2.15.0', device='cuda')"
    monkeypatch.setattr(sessions, "gpu_visible", lambda: False)
    monkeypatch.setattr(sys, "argv", ["nox", "-s", name if named else "matrix"])
    rec = Recorder(tmp_path / "venv")
    rec.name = name
    matrix = load_matrix(ROOT / "matrix.yaml")
    if named:
        with pytest.raises(AssertionError, match="no GPU visible .*: this cuda session cannot run here"):
            sessions.run_version(rec, matrix, "2.15.0", "cuda", root=ROOT, runs=tmp_path / "runs")
    else:
        with pytest.raises(pytest.skip.Exception, match="named on the command line is an error instead"):
            sessions.run_version(rec, matrix, "2.15.0", "cuda", root=ROOT, runs=tmp_path / "runs")
    assert rec.installs == [] and rec.runs == []


def test_the_incremental_bench_runs_under_the_matrix_venvs_bytecode(tmp_path, monkeypatch):
    """``nox -s incremental`` measures what ``nox -s matrix`` pays: its processes read the
    matrix venv's bytecode, where the caller's ``PYTHONDONTWRITEBYTECODE`` would have each
    compile torch's sources again (about 3 s more per run)."""
    import importlib.util

    import nox.registry

    monkeypatch.setattr(nox.registry, "_REGISTRY", {})  # its sessions, as nox would load them: once
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setattr(noxfile, "_torch_env", lambda *a: str(python))
    calls = []

    class Recorder:
        posargs: list[str] = []

        def run(self, *args, **kw):
            calls.append((args, kw))

    noxfile.incremental(Recorder())
    (args, kw), = calls
    assert args[:2] == (str(python), "bench/incremental.py")
    assert args[args.index("--slots") + 1] == str(noxfile.MATRIX.device("cpu").slots)  # as nox -s matrix launches
    assert kw["env"] == {"PYTHONPATH": str(ROOT), **bytecode_env(tmp_path / "venv" / ".fsdp-compat")}
