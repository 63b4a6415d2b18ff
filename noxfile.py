"""nox sessions. The matrix is parametrized from matrix.yaml.

    nox -s matrix                      # every (torch, device) cell of matrix.yaml
    nox -s "matrix(torch='2.12.1', device='cpu')"
    FSDP_COMPAT_MATRIX=my.yaml nox -s matrix   # another matrix file (or: nox -s matrix -- --config my.yaml)
    nox -s tests                       # the test suite (torch 2.13.0, CPU)
    nox -s report                      # reports/compat.{md,html,csv} from runs/matrix (and runs/stacks)
    nox -s stacks                      # public stacks' patch functions on every CPU torch version
    nox -s prerelease                  # newest stable torch -> each pre-release torch of the records
    nox -s bench                       # launch amortization benchmark
    nox -s mutants                     # mutants of fsdp_patches: does some scenario catch each one?
    nox -s chaos                       # fault-injection soak of the launcher
    nox -s shuffle                     # the CPU set in planned and shuffled order: no verdict may change
    nox -s lint
    nox --json -l                      # session list for CI job matrices
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from harness.envs.matrix import load_matrix  # noqa: E402
from harness.envs.session import (  # noqa: E402
    bytecode_env,
    harness_folder,
    matrix_file,
    matrix_installs,
    records_folder,
    run_version,
)

nox.options.reuse_existing_virtualenvs = True

try:
    MATRIX_FILE = matrix_file(ROOT, os.environ, sys.argv)
    MATRIX = load_matrix(MATRIX_FILE)
except ValueError as e:  # one line naming the field, exit 2 (not nox's traceback)
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
TEST_TORCH = "2.13.0"
RUNS = records_folder(ROOT, MATRIX_FILE)
SENSITIVITY = ROOT / "runs" / "sensitivity"


@nox.session(venv_backend="uv", reuse_venv=True)
@nox.parametrize(("torch", "device"), MATRIX.cells())
def matrix(session: nox.Session, torch: str, device: str) -> None:
    """One matrix cell: every scenario and variant on one torch version and device.

    ``nox -s matrix -- --runner pytest [-n N]`` runs the cells as pytest items instead
    (the plugin in harness/pytest_plugin.py), with JUnit XML beside the records. The body:
    ``harness.envs.session.run_version``.
    """
    run_version(session, MATRIX, torch, device, root=ROOT, runs=RUNS)


def _install_project(session: nox.Session, *extras: str) -> None:
    session.install(f"torch=={TEST_TORCH}")
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on torch 2.13.0 (CPU), the hf_ pack included."""
    _install_project(session, "test", "hf")
    session.run("python", "-m", "pytest", "-n", "2", "-q", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Build reports/compat.{md,html,csv} from the matrix records."""
    session.install("pandas", "packaging", "tabulate", "jinja2")
    records = _posargs(session) or [str(RUNS.relative_to(ROOT))]  # relative: the report names its sources
    stacks = ["--stacks", "runs/stacks"] if (ROOT / "runs" / "stacks").is_dir() else []
    session.run("python", "-m", "harness", "report", "--records", *records, "--out", "reports", *stacks,
                env={"PYTHONPATH": str(ROOT)})


@nox.session
def diff(session: nox.Session) -> None:
    """What changed between two runs: nox -s diff -- OLD NEW [--out FILE] (records or compat.csv)."""
    session.install("pandas", "packaging", "tabulate", "jinja2")
    session.run("python", "-m", "harness", "diff", *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session
def prerelease(session: nox.Session) -> None:
    """The pre-release lane: what changes from the newest stable torch to each pre-release
    torch of the records: nox -s prerelease [-- --records PATH... --out FILE] (default: the matrix's
    records). Prints nothing when they hold no pre-release; exit 1 when a candidate got worse."""
    session.install("pandas", "packaging", "tabulate", "jinja2")
    args = _posargs(session)
    if "--records" not in args:
        args = ["--records", str(RUNS.relative_to(ROOT)), *args]
    session.run("python", "-m", "harness", "prerelease", *args, env={"PYTHONPATH": str(ROOT)})


def _posargs(session: nox.Session) -> list[str]:
    """The session's arguments without ``--config FILE`` (read when the noxfile loads)."""
    from harness.envs.session import without_config

    return without_config(session.posargs)


def _torch_env(session: nox.Session, torch: str, device: str) -> str:
    """A uv venv for ``torch`` (shared with the matrix cell's, so it is usually there) with what
    the matrix session installs (the hf_ pack's transformers, ``install:`` entries); its python."""
    slug = torch.replace(".", "-")
    venv = ROOT / ".nox" / f"matrix-torch-{slug}-device-{device}"
    python = venv / "bin" / "python"
    if not python.exists():
        session.run("uv", "venv", "-q", "-p", "3.11", str(venv), external=True)
    torch_args, hf, extra = matrix_installs(MATRIX, torch, device, harness_folder(venv))
    for args in (torch_args, hf, [*torch_args, *extra] if extra else []):
        if args:
            session.run("uv", "pip", "install", "-q", "-p", str(python), *args, external=True)
    return str(python)


@nox.session(python=False)
def repro(session: nox.Session) -> None:
    """Reproduce one cell on a given torch: nox -s repro -- SCENARIO --torch 2.12.1 [--world-size 2] [...]."""
    import argparse

    parser = argparse.ArgumentParser(prog="nox -s repro --")
    parser.add_argument("--torch", required=True)
    parser.add_argument("--device", default="cpu")
    known, rest = parser.parse_known_args(session.posargs)
    python = _torch_env(session, known.torch, known.device)
    own = harness_folder(Path(python).parent.parent)  # the matrix venv's bytecode, shared
    session.run(python, "-m", "harness", "repro", *rest, "--device", known.device,
                env={"PYTHONPATH": str(ROOT), **bytecode_env(own)}, external=True)


@nox.session(python=False)
def stacks(session: nox.Session) -> None:
    """Public stacks (stacks/): fetch each stack's wheel (no dependencies; offline: one line and a
    skip), then judge its patch functions on every CPU torch version of matrix.yaml; records in
    runs/stacks/, the report's Public stacks section (nox -s report). -- --stack NAME: only it."""
    env = {"PYTHONPATH": str(ROOT)}
    session.run(sys.executable, "-m", "harness", "stacks", "fetch", env=env, external=True, success_codes=[0, 1])
    for torch in [v for v, device in MATRIX.cells() if device == "cpu"]:
        python = _torch_env(session, torch, "cpu")
        own = harness_folder(Path(python).parent.parent)
        session.run(python, "-m", "harness", "stacks", "run", "--out", "runs/stacks", *session.posargs,
                    env={**env, **bytecode_env(own)}, external=True)


#: world-size-1 cells where the GPU matters: bf16 compute on cuda (B, C) and grads
#: offloaded to the host while the group serves cuda (F: NCCL-only norm, G: scaling)
GPU_SMOKE = ["b1_mixed_dtype_unused_api", "b2_mixed_dtype_late_param", "c_skipped_vision_tower",
             "f_offload_clip_nccl_only", "f_offload_clip_mixed_backend", "g_offload_grad_scaling"]


@nox.session(name="gpu-smoke", python=False)
def gpu_smoke(session: nox.Session) -> None:
    """Single-GPU smoke test: nox -s gpu-smoke -- OUTDIR (records in OUTDIR/gpu-smoke.jsonl)."""
    if not session.posargs:
        session.error("usage: nox -s gpu-smoke -- OUTDIR")
    out = Path(session.posargs[0])
    out.mkdir(parents=True, exist_ok=True)
    args = ["--device", "cuda", "--world-size", "1", "--out", str(out / "gpu-smoke.jsonl"), "--timeout", "120"]
    for name in GPU_SMOKE:
        args += ["--scenario", name]
    session.run(sys.executable, "-m", "harness", "run", *args, env={"PYTHONPATH": str(ROOT)}, external=True)


@nox.session
def shuffle(session: nox.Session) -> None:
    """Order independence: the default CPU scenario set on this session's torch, and the leak
    probes (tests/fixtures/leaks), each in the planned order and in a shuffled one; exit 1 when
    any verdict differs. nox -s shuffle [-- SEED]
    (default: a new seed each time, printed; the same seed gives the same order)."""
    import random

    _install_project(session, "hf")
    session.install("pandas", "tabulate", "jinja2")
    seed = session.posargs[0] if session.posargs else str(random.randrange(2**31))
    folder = ROOT / "runs" / "shuffle"
    folder.mkdir(parents=True, exist_ok=True)
    # the default CPU set, and the leak probes: scenarios and a patch set that leave hooks,
    # configs, settings, a child process and wrapped torch functions behind, and a probe after them
    leaks = ["--scenarios-dir", "tests/fixtures/leaks", "--patches", "tests/fixtures/leaky_patches.py",
             "--world-size", "1", "--variant", "vanilla", "--variant", "patched"]
    leaks += [a for name in ("a_leak_state", "b_leak_linear", "c_patch_leaks", "z_probe") for a in ("--scenario", name)]
    for label, args in (("default", []), ("leaks", leaks)):
        for name, extra in {"planned": [], "shuffled": ["--shuffle", seed]}.items():
            out = folder / f"{label}-{name}.jsonl"
            out.unlink(missing_ok=True)  # records are appended
            # exit 1 (a cell not as documented) is the diff's business, not this run's
            session.run("python", "-m", "harness", "run", "--quiet", "--out", str(out), *args, *extra,
                        success_codes=[0, 1], env={"PYTHONPATH": str(ROOT)})
        session.run("python", "-m", "harness", "diff", "--strict", str(folder / f"{label}-planned.jsonl"),
                    str(folder / f"{label}-shuffled.jsonl"), "--out", str(folder / f"diff-{label}-seed-{seed}.md"),
                    env={"PYTHONPATH": str(ROOT)})


@nox.session
def sensitivity(session: nox.Session) -> None:
    """Faults injected on the FSDP2 side of every cell documented to pass (harness.train.faults): each
    must become a mismatch naming every parameter it changed. Records in runs/sensitivity/ (nox -s
    report adds their blind-spot table), the table in reports/blind-spots.md; exit 1 on a blind spot.
    nox -s sensitivity [-- harness run options, e.g. --scenario plain --fault grad_rel]"""
    _install_project(session, "hf")
    session.install("pandas", "tabulate", "jinja2")
    out = SENSITIVITY / f"torch-{TEST_TORCH}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # records are appended
    faults = [] if "--fault" in session.posargs else ["--fault", "all"]
    session.run("python", "-m", "harness", "run", "--quiet", *faults, "--out", str(out), *session.posargs,
                success_codes=[0, 1], env={"PYTHONPATH": str(ROOT)})  # a miss is the table's business
    session.run("python", "-m", "harness", "blind-spots", str(out), "--out", str(ROOT / "reports" / "blind-spots.md"),
                env={"PYTHONPATH": str(ROOT)})


@nox.session
def portability(session: nox.Session) -> None:
    """The same verdicts on every CPU kernel set this machine offers (ATEN_CPU_CAPABILITY=default, avx2,
    avx512 where the CPU has it) and with 1 and 2 intra-op threads per rank: the suite once per setting,
    then harness diff --strict against the first (exit 1 on any verdict change). nox -s portability
    [-- harness run options, e.g. --scenario hf_llama_compiled_block --world-size 1]"""
    from harness.process.cpus import kernel_sets

    _install_project(session, "hf")
    session.install("pandas", "tabulate", "jinja2")
    folder = ROOT / "runs" / "portability"
    folder.mkdir(parents=True, exist_ok=True)
    settings = [(isa, "1") for isa in kernel_sets()] + [(kernel_sets()[-1], "2")]
    outs = []
    for isa, threads in settings:
        out = folder / f"{isa}-threads{threads}.jsonl"
        out.unlink(missing_ok=True)
        session.run("python", "-m", "harness", "run", "--quiet", "--out", str(out), *session.posargs,
                    success_codes=[0, 1], env={"PYTHONPATH": str(ROOT), "ATEN_CPU_CAPABILITY": isa,
                                               "OMP_NUM_THREADS": threads})
        outs.append(out)
    for out in outs[1:]:
        session.run("python", "-m", "harness", "diff", "--strict", str(outs[0]), str(out), "--out",
                    str(out.with_suffix(".diff.md")), env={"PYTHONPATH": str(ROOT)})


@nox.session
def bench(session: nox.Session) -> None:
    """One torchrun per cell vs many cells per torchrun, side by side; and the CPU suite wall
    (the hf_ pack included, so transformers too)."""
    _install_project(session, "hf")
    session.run("python", "bench/launch_bench.py", *session.posargs)


@nox.session(python=False)
def incremental(session: nox.Session) -> None:
    """The default CPU matrix of the test torch fresh, then after each edit of bench/incremental.py
    (none, a comment, patch functions, a scenario file, a helper, a broken patch function): cells run, wall, verdicts."""
    python = _torch_env(session, TEST_TORCH, "cpu")
    own = harness_folder(Path(python).parent.parent)  # the matrix venv's bytecode, as its sessions read it
    slots = next((str(d.slots) for d in MATRIX.devices if d.device == "cpu"), "1")
    session.run(python, "bench/incremental.py", "--python", python, "--slots", slots, *session.posargs,
                env={"PYTHONPATH": str(ROOT), **bytecode_env(own)}, external=True)


@nox.session
def chaos(session: nox.Session) -> None:
    """Fault-injection soak of the launcher: nox -s chaos [-- --faults 100 --seed 0]."""
    _install_project(session)
    session.run("python", "tests/chaos.py", *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session
def mutants(session: nox.Session) -> None:
    """Small realistic mistakes in copies of fsdp_patches, each run on its scenarios: table and kill ratio.

    Mutants of code paths for older torch releases run on that release (its matrix venv)."""
    from tests.mutation import DEFAULT_TORCH, MUTANTS

    _install_project(session)
    pythons = []
    for torch in sorted({m.torch for m in MUTANTS} - {DEFAULT_TORCH}):
        pythons += ["--python-for", f"{torch}={_torch_env(session, torch, 'cpu')}"]
    session.run("python", "tests/mutation.py", *pythons, *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "harness", "scenarios", "fsdp_patches", "tests", "bench", "noxfile.py")
