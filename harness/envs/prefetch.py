"""The next matrix session's packages, fetched into uv's cache while this session runs its cells.

A cold matrix downloads and unpacks several GB per torch version (a CUDA build and its
libraries) before that version's first cell, one session after the other, while the cells
of the version before use the CPU, not the network. So each matrix session, once its own
installs are done, starts ``uv pip install`` of the *next queued* matrix session's packages
into a scratch folder next to the venvs (the same file system, so uv hard-links from its
cache), which is removed when uv ends. That session's own install then finds them in the
cache. Nothing is fetched when no matrix session is queued after this one (a single cell,
as the GPU workflow runs them). The fetch dies with nox (``die_with_parent``), and a scratch
folder left by a killed fetch is removed by the next.

    python -m harness.envs.prefetch SCRATCH -- UV_ARGS...   (started by ``start``)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SCRATCH_PREFIX", "main", "queued_cells", "queued_venv", "start"]

#: scratch folders under nox's envdir: ``.prefetch-<torch>-<device>``
SCRATCH_PREFIX = ".prefetch-"


def _queued(session: Any) -> list[tuple[tuple[str, str], Any]]:
    """((torch, device), runner) of each matrix session nox will run after this one, in order;
    [] where nox's queue cannot be read (its layout is nox's own: ``session._runner.manifest._queue``)."""
    runner = getattr(session, "_runner", None)
    queue = getattr(getattr(runner, "manifest", None), "_queue", None)
    if runner is None or not isinstance(queue, list):
        return []
    found = []
    for queued in queue:
        spec = getattr(getattr(queued, "func", None), "call_spec", None) or {}
        if getattr(queued, "name", None) == runner.name and "torch" in spec and "device" in spec:
            found.append(((str(spec["torch"]), str(spec["device"])), queued))
    return found


def queued_cells(session: Any) -> list[tuple[str, str]]:
    """(torch, device) of the matrix sessions nox will run after this one, in order."""
    return [cell for cell, _ in _queued(session)]


def queued_venv(session: Any, cell: tuple[str, str]) -> Path | None:
    """The venv folder of the queued matrix session for ``cell`` (torch, device), from nox's
    queue (a session runner's ``envdir``), absolute as nox makes the venv's location: the
    paths in its installs (an overrides file) are written so; None where the queue does not say."""
    for queued_cell, queued in _queued(session):
        if queued_cell == cell and isinstance(getattr(queued, "envdir", None), str):
            return Path(os.path.abspath(queued.envdir))  # nox's default envdir is relative (.nox)
    return None


def start(envdir: Path, label: str, python: str, uv_args: Callable[[Path], list[str]]) -> subprocess.Popen | None:
    """Start fetching the next session's install line (``uv_args(folder)``: its files, such
    as an overrides file, go in ``folder``) into ``envdir/.prefetch-<label>``, run by this
    session's ``python`` (which has the harness's packages); the process, or None where uv
    is not there. Its output goes to ``envdir/.prefetch-<label>.log``."""
    uv = shutil.which("uv")
    if uv is None:
        return None
    for stale in envdir.glob(f"{SCRATCH_PREFIX}*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    scratch = envdir / f"{SCRATCH_PREFIX}{label}"
    scratch.mkdir(parents=True)
    cmd = [python, "-m", "harness.envs.prefetch", str(scratch), "--", uv, "pip", "install", "-q",
           "--python", python, "--target", str(scratch / "site"), *uv_args(scratch)]
    with open(envdir / f"{SCRATCH_PREFIX}{label}.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=Path(__file__).resolve().parents[2])


def main(argv: list[str] | None = None) -> int:
    from harness.process.tree import die_with_parent

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m harness.envs.prefetch SCRATCH -- COMMAND...", file=sys.stderr)
        return 2
    die_with_parent()
    scratch = Path(args[0])
    try:  # uv dies with this process, which dies with nox
        return subprocess.run(args[2:], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent).returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
