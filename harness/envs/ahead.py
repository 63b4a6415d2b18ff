"""The next matrix session's ``harness run``, started while this session runs its cells.

A rerun of ``nox -s matrix`` with nothing changed runs a dozen cells a version (the
documented hangs and crashes always run), and each version's ``harness run`` spends about
2 s planning (reading the records it may reuse, keying every cell) while its server
spends about 3 s of CPU importing torch, the scenarios' requirements and the patch preload:
one version after the other, that was most of a rerun's wall. So a matrix session whose
next queued matrix session reuses a venv that already holds its installs
(``session.installed``) starts that session's ``harness run`` itself (``start_next``), with
``--hold``: it plans and its server imports while this session's cells run, then it waits,
having written nothing. The next session adopts it (``adopt``) only where its command and
environment are exactly those it would run now (nox's own ``_get_env``) and its venv is as
it was; it then removes the records file the run replaces, lets the run go and passes its
output and exit code on as ``session.run`` would. Otherwise it ends the held run and runs
its own.

This session carries the next one's records over (``carry_over``: the ``--reuse-from``
file) but leaves its records file in place until the adoption, so a matrix stopped in
between (``nox -x`` after a failure) loses nothing. The held run reads that file too:
each of its lines is in the carried-over file or hidden there by a newer line of its key,
so it reuses the same records, and at most an older key the carry-over trimmed, never
another key's. A held run dies with nox (its parent-death signal); one nox never adopted
is ended when nox ends. Only the harness runner and CPU sessions: a CUDA session's
server is not started early (``harness.launch.prestart``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Held", "adopt", "end", "held_for", "start_next", "watched"]

#: (torch, device) -> the held run started for that session (nox runs sessions in one process)
_HELD: dict[tuple[str, str], Held] = {}


@dataclass(kw_only=True)
class Held:
    """A matrix session's ``harness run``, started by the session before it, waiting."""

    proc: subprocess.Popen
    #: the command and environment it was started with
    cmd: list[str]
    env: dict[str, str]
    #: what its venv was when it started (``_venv_state``)
    venv: tuple
    #: its ``--reuse-from`` file (None: nothing to reuse)
    previous: Path | None
    #: the folders whose Python files it read (``_sources_state``), and what they were
    watched: tuple[Path, ...]
    sources: tuple


def _die_with_parent() -> None:
    """In the child: SIGTERM when nox's thread that started it ends (Linux' parent-death signal),
    which ``harness run`` takes as it takes one from nox: held, it exits having written nothing;
    running, it ends its cells and finishes its records."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _venv_state(venv: Path) -> tuple:
    """What would show the venv recreated or its installs changed since (the next session installs
    before it adopts: a package uv upgraded there would make the held run's keys and imports
    stale): its config file's identity, the bytecode mark's text (``session.write_bytecode``) and
    every installed distribution's metadata folder with its time."""
    from harness.envs.session import harness_folder

    cfg, mark = venv / "pyvenv.cfg", harness_folder(venv) / "bytecode-written"
    stat = cfg.stat() if cfg.exists() else None
    dists = []
    for info in sorted(venv.glob("lib/python*/site-packages/*.dist-info")):
        with contextlib.suppress(OSError):
            dists.append((info.name, info.stat().st_mtime_ns))
    return (stat and (stat.st_ino, stat.st_mtime_ns), mark.read_text() if mark.is_file() else None, tuple(dists))


def watched(root: Path, matrix: Any) -> list[Path]:
    """The folders whose code a matrix session's run reads: the project's, the matrix's scenario
    folders, and the patches module's where it is a path outside them."""
    folders = [root, *(root / d for d in matrix.scenarios_dirs)]
    if "/" in matrix.patches or matrix.patches.endswith(".py"):
        module = root / matrix.patches
        folders.append(module if module.is_dir() else module.parent)
    return folders


def _sources_state(folders: Sequence[Path]) -> tuple:
    """Every Python file under ``folders`` (hidden folders, ``runs``, ``reports`` and bytecode
    left out) with its size and time: an edit (or a pull) since the held run planned, which its
    keys and its server's imports would not show."""
    found = []
    for folder in folders:
        for top, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "reports", "__pycache__")]
            for name in files:
                if name.endswith(".py"):
                    with contextlib.suppress(OSError):
                        st = os.stat(path := os.path.join(top, name))
                        found.append((path, st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def nox_env(virtualenv: Any, env: Mapping[str, str]) -> dict[str, str] | None:
    """The environment nox's ``session.run(..., env=env)`` gives its command (nox's own
    ``_get_env``, without the ``None`` values it drops); None where this nox has no such method."""
    get = getattr(virtualenv, "_get_env", None)
    if get is None:
        return None
    return {k: v for k, v in get(dict(env), include_outer_env=True).items() if v is not None}


def start_next(session: Any, matrix: Any, *, after: tuple[str, str], watched: Sequence[Path],
               command: Callable[..., tuple[list[str], dict[str, str], Path | None]]) -> Held | None:
    """Start the ``harness run`` of the matrix session nox runs after this one, held
    (``command(torch, device, venv)``: its arguments after ``python``, its ``env`` and its
    ``--reuse-from`` file, carried over by then; ``watched``: the folders of the code it reads);
    None where there is none to start: no next matrix session, not a CPU one, its venv not
    reused or lacking its installs, nox only installing (``--install-only``), a nox whose
    environment this cannot know, or anything failing here (a warning: the next session then
    runs its own)."""
    try:
        return _start_next(session, matrix, after=after, watched=watched, command=command)
    except Exception as e:  # a convenience: never worth failing this session's run for
        print(f"warning: the next matrix session's run was not started ahead: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        return None


def _start_next(session: Any, matrix: Any, *, after: tuple[str, str], watched: Sequence[Path],
                command: Callable[..., tuple[list[str], dict[str, str], Path | None]]) -> Held | None:
    from harness.envs import prefetch
    from harness.envs.session import installed

    if _install_only(session):
        return None
    queued = [(cell, runner) for cell, runner in prefetch._queued(session) if cell != after]
    if not queued or queued[0][0][1] != "cpu" or queued[0][0] in _HELD:
        return None
    (torch, device), runner = queued[0]
    reused = getattr(runner, "reuse_existing_venv", None)
    envdir = getattr(runner, "envdir", None)
    if reused is None or not reused() or not isinstance(envdir, str):
        return None
    venv, mine = Path(os.path.abspath(envdir)), Path(session.virtualenv.location)  # as nox makes it
    if not (venv / "bin" / "python").is_file() or not installed(matrix, torch, device, venv):
        return None
    args, env, previous = command(torch, device, venv)
    full = nox_env(session.virtualenv, {**env, "VIRTUAL_ENV": str(venv),
                                        "NOX_CURRENT_SESSION": str(getattr(runner, "friendly_name", ""))})
    if full is None:
        return None
    # nox derives the rest from the session's venv (PATH, uv's UV_PYTHON, ...): this one's there
    full = {k: v.replace(str(mine), str(venv)) for k, v in full.items()}
    cmd = _held_command(str(venv / "bin" / "python"), args)
    state, sources = _venv_state(venv), _sources_state(watched)
    proc = subprocess.Popen(cmd, env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", preexec_fn=_die_with_parent)
    held = _HELD[(torch, device)] = Held(proc=proc, cmd=cmd, env=full, venv=state, previous=previous,
                                         watched=tuple(watched), sources=sources)
    return held


def _install_only(session: Any) -> bool:
    """``nox --install-only``: nox's ``session.run`` runs nothing."""
    return bool(getattr(getattr(getattr(session, "_runner", None), "global_config", None), "install_only", False))


def _held_command(python: str | None, args: Sequence[str]) -> list[str]:
    """``python ARGS`` (``-m harness run ...``) with ``--hold``."""
    return [str(python), *args[:3], "--hold", *args[3:]]


def held_for(torch: str, device: str) -> Held | None:
    """The held run started for this session, if any (taken: a second call gets None)."""
    return _HELD.pop((torch, device), None)


def adopt(session: Any, held: Held, args: Sequence[str], env: Mapping[str, str], replaced: Sequence[Path],
          on_go: Callable[[], None] = lambda: None) -> bool:
    """Run ``held`` as this session's ``session.run("python", *args, env=env)`` where it is
    exactly that command, still waiting, in a venv and on code as they were: remove ``replaced``
    (the records the run replaces), let it go, call ``on_go``, pass its output on, fail the
    session on its exit code as ``session.run`` would (``CommandFailed``). Whether it was
    adopted (if not, it has been ended)."""
    from nox.command import CommandFailed

    venv = Path(session.virtualenv.location)
    python = shutil.which("python", path=os.pathsep.join(getattr(session, "bin_paths", None) or [str(venv / "bin")]))
    if (held.proc.poll() is not None or _install_only(session) or nox_env(session.virtualenv, env) != held.env
            or _held_command(python, args) != held.cmd or _venv_state(venv) != held.venv
            or _sources_state(held.watched) != held.sources):
        end(held)
        return False
    for path in replaced:
        path.unlink(missing_ok=True)
    if (log := getattr(session, "log", None)) is not None:
        log(f"{' '.join(held.cmd)}  (planned while the session before ran its cells)")
    try:
        held.proc.stdin.write("go\n")
        held.proc.stdin.close()
    except OSError:  # it ended while this looked: its output and code say why
        pass
    code = None
    try:
        on_go()
        _relay(held.proc.stdout)
        code = held.proc.wait()
    finally:
        if code is None:  # interrupted (the terminal's SIGINT reached it too) or failed here: let it finish
            _stop(held.proc)
    if code:
        from nox.logger import logger

        logger.error(f"Command {' '.join(held.cmd)} failed with exit code {code}")
        raise CommandFailed(f"Returned code {code}", return_code=code)
    return True


def _relay(stream: Any) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def _stop(proc: subprocess.Popen) -> None:
    """An adopted run this session stops following: SIGTERM (its cells end, its records are
    finished), the time nox gives a command, then SIGKILL; what it printed meanwhile is shown."""
    with contextlib.suppress(OSError):
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(Exception):
        _relay(proc.stdout)


def end(held: Held) -> None:
    """End a held run that will not be adopted (its server dies with it)."""
    if held.proc.poll() is None:
        held.proc.kill()
    held.proc.wait()
    for stream in (held.proc.stdin, held.proc.stdout):
        with contextlib.suppress(OSError):
            stream.close()
