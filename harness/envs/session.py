"""``nox -s matrix``: which matrix file nox reads, and the body of one (torch, device) session.

The body lives here, not in ``noxfile.py``, so a test can run it with a stand-in session
(anything with nox's ``install``, ``run``, ``skip``, ``error``, ``posargs`` and
``virtualenv.location``).

Another matrix file: ``FSDP_COMPAT_MATRIX=my.yaml nox -s matrix`` or ``nox -s matrix --
--config my.yaml`` (relative paths are taken from the project folder, where nox runs);
its records go to ``runs/matrix-<name>/`` so they never mix with the default matrix's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from harness.envs import ahead
from harness.envs.matrix import Matrix
from harness.envs.packages import torch_install_args
from harness.results.machine import TORCH_SOURCE_ENV
from harness.results.reusable import carry_over

__all__ = ["MATRIX_ENV", "bytecode_env", "gpu_visible", "harness_folder", "install_key", "installed", "matrix_file",
           "matrix_installs", "prefetch_next", "records_folder", "run_version", "session_args", "without_config",
           "write_bytecode"]

MATRIX_ENV = "FSDP_COMPAT_MATRIX"
DEFAULT_MATRIX = "matrix.yaml"


def _take(args: Sequence[str], option: str) -> tuple[str | None, list[str]]:
    """``option VALUE`` or ``option=VALUE`` taken out of ``args``: (value or None, the rest)."""
    rest, value = list(args), None
    for i, arg in enumerate(rest):
        if arg == option:
            if i + 1 >= len(rest):
                raise ValueError(f"{option} needs a value")
            value = rest[i + 1]
            del rest[i:i + 2]
            break
        if arg.startswith(option + "="):
            value = arg.partition("=")[2]
            del rest[i]
            break
    return value, rest


def without_config(posargs: Sequence[str]) -> list[str]:
    """A session's arguments without ``--config FILE`` (``matrix_file`` read it when nox loaded)."""
    return _take(posargs, "--config")[1]


def session_args(posargs: Sequence[str]) -> tuple[str, list[str]]:
    """A matrix session's arguments: the runner (``--runner harness|pytest``) and what goes
    on to it (``--config`` dropped)."""
    runner, rest = _take(without_config(posargs), "--runner")
    runner = "harness" if runner is None else runner
    if runner not in ("harness", "pytest"):
        raise ValueError(f"--runner must be harness or pytest, got {runner!r}")
    return runner, rest


def matrix_file(root: Path, environ: Mapping[str, str], argv: Sequence[str]) -> Path:
    """The matrix nox parametrizes from: ``--config PATH`` among the session arguments
    (after ``--``), else ``$FSDP_COMPAT_MATRIX``, else ``matrix.yaml``; relative to ``root``.
    ``ValueError`` when both name a file and not the same one."""
    args = list(argv)
    from_args = _take(args[args.index("--") + 1:], "--config")[0] if "--" in args else None
    from_env = environ.get(MATRIX_ENV) or None
    paths = [(root / p).resolve() for p in (from_args, from_env) if p]
    if len(paths) == 2 and paths[0] != paths[1]:
        raise ValueError(f"--config {from_args} and {MATRIX_ENV}={from_env} name different matrix files")
    return paths[0] if paths else root / DEFAULT_MATRIX


def records_folder(root: Path, matrix: Path) -> Path:
    """``runs/matrix`` for the project's matrix.yaml, ``runs/matrix-<name>`` for another file."""
    default = matrix.resolve() == (root / DEFAULT_MATRIX).resolve()
    return root / "runs" / ("matrix" if default else f"matrix-{matrix.stem}")


def gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def harness_folder(venv: Path) -> Path:
    """The harness's own files in a matrix venv: torch's install files (an overrides file),
    the bytecode and its mark."""
    return venv / ".fsdp-compat"


def matrix_installs(matrix: Matrix, torch: str, device: str, folder: Path) -> tuple[list[str], list[str], list[str]]:
    """What a matrix session installs for (``torch``, ``device``): torch's arguments (their
    files in ``folder``), the hf_ pack's transformers, the matrix's ``install`` entries (each
    resolved with torch's arguments again, so torch stays as it is)."""
    transformers = matrix.transformers_for(torch)
    return (torch_install_args(torch, device, folder, matrix.source(torch, device)),
            [f"transformers=={transformers}"] if transformers else [], list(matrix.install_for(torch) or []))


#: where a matrix venv keeps the bytecode of everything its processes import (the project's
#: own modules included, so the checkout gets no __pycache__ folders)
BYTECODE_FOLDER = "pycache"


def bytecode_env(folder: Path) -> dict[str, str]:
    """The environment under which a matrix venv's processes read and write bytecode in the
    venv's own folder, even where the caller's environment forbids writing bytecode
    (``PYTHONDONTWRITEBYTECODE``: empty means unset). uv installs no bytecode; without it
    every rank process compiled torch's sources as it imported them, each time
    (``import torch, torch.distributed.fsdp``: 7.3 s, then 2.3 s)."""
    return {"PYTHONPYCACHEPREFIX": str(folder / BYTECODE_FOLDER), "PYTHONDONTWRITEBYTECODE": ""}


def install_key(parts: Sequence[Sequence[str]]) -> str:
    """A set of installs (``matrix_installs``) as the bytecode mark keeps it."""
    return " ".join(arg for part in parts for arg in part)


def installed(matrix: Matrix, torch: str, device: str, venv: Path) -> bool:
    """Whether the venv ``venv`` holds the installs of matrix session (``torch``, ``device``), as its
    bytecode mark (``write_bytecode``) says: written for exactly those installs."""
    folder = harness_folder(venv)
    mark = folder / "bytecode-written"
    return mark.is_file() and mark.read_text() == install_key(matrix_installs(matrix, torch, device, folder))


def write_bytecode(session: Any, folder: Path, key: str, *, root: Path, scenario_dirs: Sequence[str] = ()) -> bool:
    """Write the bytecode of what a launch imports (``harness.envs.warm``, one process) once
    per set of installs ``key`` (a mark in ``folder``); whether it ran. Modules imported
    later than that (a cell's lazy imports) are compiled by the first process to import them."""
    mark = folder / "bytecode-written"
    if mark.exists() and mark.read_text() == key:
        return False
    getattr(session, "run_install", session.run)("python", "-m", "harness.envs.warm", *scenario_dirs, silent=True,
                                                 env={"PYTHONPATH": str(root), **bytecode_env(folder)})
    folder.mkdir(parents=True, exist_ok=True)
    mark.write_text(key)
    return True


def prefetch_next(session: Any, matrix: Matrix, *, after: tuple[str, str]) -> Any:
    """Start fetching the installs of the matrix session nox runs next (``harness.envs.prefetch``)
    while this one runs its cells; the fetch's process, or None (none queued, no uv)."""
    from harness.envs import prefetch

    queued = [c for c in prefetch.queued_cells(session) if c != after]
    if not queued:
        return None
    torch, device = queued[0]
    if device == "cuda" and not gpu_visible():  # it will be skipped
        return None
    venv = prefetch.queued_venv(session, (torch, device))
    if venv is not None and installed(matrix, torch, device, venv):
        return None  # a rerun: hard-linking torch into a scratch folder would only take CPU from this session's cells

    def args(folder: Path) -> list[str]:
        return [arg for part in matrix_installs(matrix, torch, device, folder) for arg in part]

    envdir = Path(session.virtualenv.location).parent
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    return prefetch.start(envdir, f"{torch}-{device}", python, args)


def run_version(session: Any, matrix: Matrix, torch: str, device: str, *, root: Path, runs: Path) -> None:
    """One matrix cell: install torch ``torch`` (from its own source where the matrix gives
    one), the hf_ pack's transformers and the matrix's ``install`` entries into the session's
    venv, then run every scenario (the project's and ``scenarios_dirs``) and variant on
    ``device``; records in ``runs/<device>/torch-<torch>.jsonl``.

    ``-- --runner pytest`` runs the cells as pytest items instead (the plugin in
    ``harness/pytest_plugin.py``), with JUnit XML beside the records."""
    held = ahead.held_for(torch, device)  # this session's run, started by the session before (harness.envs.ahead)
    try:
        _run_version(session, matrix, torch, device, root=root, runs=runs, held=held)
    finally:
        if held is not None:  # not adopted (an install failed, the pytest runner), or done
            ahead.end(held)


def _run_version(session: Any, matrix: Matrix, torch: str, device: str, *, root: Path, runs: Path,
                 held: ahead.Held | None) -> None:
    from nox.command import CommandFailed

    try:
        runner, rest = session_args(session.posargs)
    except ValueError as e:
        session.error(str(e))
    matrix.device(device)  # a device the matrix lacks stops here
    if device == "cuda" and not gpu_visible():
        why = "no GPU visible on this machine (nvidia-smi finds none)"
        if getattr(session, "name", None) in sys.argv:  # asked for by name (the GPU workflow): it must run
            session.error(f"{why}: this cuda session cannot run here")
        session.skip(f"{why}; a cuda session named on the command line is an error instead")
    source = matrix.source(torch, device)
    own = harness_folder(Path(session.virtualenv.location))
    torch_args, hf, extra = matrix_installs(matrix, torch, device, own)
    try:
        session.install(*torch_args)
    except CommandFailed:
        origin = f" from {source.label}" if source else ""
        session.error(f"torch {torch} cannot be installed for {device}{origin} (uv's reason is above)")
    if hf:  # the hf_ scenario pack; without it those cells are skipped with the reason
        session.install(*hf)
    if extra:  # resolved with torch's own arguments again, so torch and its libraries stay as they are
        try:
            session.install(*torch_args, *extra)
        except CommandFailed:
            session.error(f"the matrix's 'install' entries cannot be installed beside torch {torch} "
                          f"(uv's reason is above)")
    prefetch_next(session, matrix, after=(torch, device))
    write_bytecode(session, own, install_key([torch_args, hf, extra]), root=root, scenario_dirs=matrix.scenarios_dirs)
    out = runs / device / f"torch-{torch}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    replaced = [out, *out.parent.glob(f"torch-{torch}-*.jsonl")]  # pytest-xdist writes one file per worker
    if runner == "pytest":
        carry_over(out)  # kept for a later run of the harness runner
        _run_pytest(session, matrix, device, out, replaced, _env(matrix, torch, device, own, root), rest)
        return
    # what this rerun may reuse of the records it replaces (a held run's session carried them over)
    previous = held.previous if held is not None else carry_over(out)
    args, env = _run_command(matrix, torch, device, own, root=root, out=out, previous=previous, rest=rest)

    def start_next() -> None:  # the next session's run, planned while this one's cells run
        ahead.start_next(session, matrix, after=(torch, device), watched=ahead.watched(root, matrix),
                         command=partial(_next_command, matrix, root=root, runs=runs, rest=rest))

    if held is not None and ahead.adopt(session, held, args, env, replaced, on_go=start_next):
        return
    for old in replaced:
        old.unlink(missing_ok=True)  # a rerun replaces this cell's records
    start_next()
    session.run("python", *args, env=env)


def _env(matrix: Matrix, torch: str, device: str, own: Path, root: Path) -> dict[str, str]:
    """The environment a matrix session's run gets (besides nox's own and its venv's)."""
    env = {"PYTHONPATH": str(root), **bytecode_env(own)}
    if (source := matrix.source(torch, device)) is not None:
        env[TORCH_SOURCE_ENV] = source.label  # stamped on every record; the report names it
    return env


def _run_command(matrix: Matrix, torch: str, device: str, own: Path, *, root: Path, out: Path,
                 previous: Path | None, rest: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """A matrix session's ``harness run``: its arguments after ``python``, and its ``env``."""
    dev = matrix.device(device)
    # --expect-torch: the run stops at once unless the venv really holds the cell's torch
    args = ["--device", device, "--out", str(out), "--patches", matrix.patches, "--timeout", str(dev.timeout_s),
            "--expect-torch", torch]
    for ws in dev.world_sizes:
        args += ["--world-size", str(ws)]
    for name in matrix.scenarios or []:
        args += ["--scenario", name]
    for name, fn in matrix.patch_map.items():
        args += ["--patch-map", f"{name}={fn}"]
    for folder in matrix.scenarios_dirs:
        args += ["--scenarios-dir", folder]
    if dev.slots != 1:
        args += ["--slots", str(dev.slots)]
    if matrix.fresh:
        args.append("--fresh")
    elif previous is not None:
        args += ["--reuse-from", str(previous)]
    return ["-m", "harness", "run", *args, *rest], _env(matrix, torch, device, own, root)


def _next_command(matrix: Matrix, torch: str, device: str, venv: Path, *, root: Path, runs: Path,
                  rest: Sequence[str]) -> tuple[list[str], dict[str, str], Path | None]:
    """``_run_command`` of the matrix session for (``torch``, ``device``) in ``venv``, its
    records carried over now (its records file stays until it is adopted)."""
    out = runs / device / f"torch-{torch}.jsonl"
    previous = carry_over(out)
    args, env = _run_command(matrix, torch, device, harness_folder(venv), root=root, out=out, previous=previous,
                             rest=rest)
    return args, env, previous


def _run_pytest(session: Any, matrix: Matrix, device: str, out: Path, replaced: list[Path], env: dict[str, str],
                rest: Sequence[str]) -> None:
    """``-- --runner pytest``: the cells as pytest items, JUnit XML beside the records."""
    dev = matrix.device(device)
    for old in replaced:
        old.unlink(missing_ok=True)
    session.install("pytest", "pytest-xdist")
    args = ["-p", "harness.pytest_plugin", "--fsdp-compat", "--fsdp-compat-device", device,
            "--fsdp-compat-out", str(out), "--fsdp-compat-patches", matrix.patches,
            "--fsdp-compat-timeout", str(dev.timeout_s), f"--junitxml={out.with_suffix('.xml')}",
            "-p", "no:cacheprovider", "-o", "testpaths=", "-q"]
    args += [f"--fsdp-compat-world-size={ws}" for ws in dev.world_sizes]
    args += [f"--fsdp-compat-patch-map={n}={fn}" for n, fn in matrix.patch_map.items()]
    args += [f"--fsdp-compat-scenario={name}" for name in matrix.scenarios or []]
    args += [f"--fsdp-compat-scenarios-dir={d}" for d in matrix.scenarios_dirs]
    session.run("python", "-m", "pytest", *args, *rest, env=env)
