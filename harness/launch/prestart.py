"""A CPU launch's forkserver started before the launcher plans, so that its imports overlap the planning.

The launcher itself imports torch, loads the scenarios and keys every cell's inputs before it
knows what to launch (about 2 s on 2 cores); the forkserver (``harness.launch.forkserver``)
then imports torch, the harness, the scenarios, their requirements and the modules a patch may
touch before the first rank can fork (about 3 s of CPU). Started at the beginning of
``harness run`` with what it can know then (the interpreter, the environment, the scenario
folders, the scenarios the run selected, whether it may install patches: ``await_launch``),
the server does that part while the launcher plans, and takes one line on its standard input:
the launch plan, the torchrun command and the launch's log. The first single-node CPU launch
hands it over (``hand``); a run that launches nothing on CPU, or whose launch environment came
out different, ends it unused (``close``) and starts its launches as before; a launcher gone
without a word leaves it the end of its input (it exits) and its death signal. Until the line
comes, the server's output goes nowhere: a server that failed to start is simply not used,
and the launch's own server meets the same failure in the launch's log.

Having torch imported by the time the launch comes, the server runs torchrun's agent in a child
forked from itself (``torchrun_forked``): torchrun's own ``main``, its rendezvous, its worker
processes and its failure summary, only not in a fresh interpreter that imports torch again.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.process import collector
from harness.runconfig import RunConfig
from harness.undertest.locations import import_root, worker_spec
from harness.vocabulary import installs_patches

__all__ = ["BACKGROUND_NICE", "PROJECT_ROOT", "Forked", "Prestarted", "await_launch", "in_background", "launch_env",
           "may_raise_priority", "started", "torchrun_forked", "warm", "worker_paths"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


#: how much lower a held run (``harness run --hold``) plans and imports than the run whose cells run meanwhile
BACKGROUND_NICE = 10
_CAP_SYS_NICE = 23


def in_background() -> Callable[[list[int]], None] | None:
    """Lower this process's CPU priority by ``BACKGROUND_NICE`` (a held run: its planning and its
    server's imports, started after it and so as low, then leave the cores to the cells of the
    run before it, whose hang looks count a rank kept waiting for a core as not quiet); returns
    what puts this process and the given ones (its server) back where they were. None, and
    nothing lowered, where they could not be put back (neither ``CAP_SYS_NICE`` nor an
    ``RLIMIT_NICE`` that allows it): the ranks, forked from that server, would then run lower."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if not may_raise_priority(before):
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(before + BACKGROUND_NICE, 19))

    def restore(others: list[int]) -> None:
        for pid in [0, *others]:
            with contextlib.suppress(OSError):  # a server gone meanwhile
                os.setpriority(os.PRIO_PROCESS, pid, before)

    return restore


def may_raise_priority(to: int) -> bool:
    """Whether this process may set its (or a child's) nice value down to ``to``."""
    import resource

    try:
        caps = next(int(line.split()[1], 16) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        caps = 0
    return bool((caps >> _CAP_SYS_NICE) & 1) or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - to


def warm(config: RunConfig, device: str) -> bool:
    """Whether a launch on ``device`` starts its ranks warm (``harness.launch.forkserver``): one
    node, CPU, Linux, unless the run says ``--cold-start``."""
    return not config.cold_start and device == "cpu" and config.nnodes == 1 and sys.platform.startswith("linux")


def worker_paths(config: RunConfig, python_path: list[str]) -> tuple[RunConfig, list[str]]:
    """``config`` with the patches module as the workers (run in the project's folder) import
    it: by absolute path where the caller named it from its own folder, else as named; and
    ``python_path`` with the folder a dotted module was found under."""
    config = config.with_(patches=worker_spec(config.patches, PROJECT_ROOT))
    root = import_root(config.patches, known=[str(PROJECT_ROOT)])
    if root is not None and str(root) not in python_path:
        python_path = [*python_path, str(root)]
    return config, python_path


def launch_env(python_path: list[str]) -> dict[str, str]:
    """The environment a launch's processes start with (before any device's own settings)."""
    env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")]), *python_path])
    return env


@dataclass(kw_only=True)
class Prestarted:
    """A server waiting for its launch."""

    proc: subprocess.Popen
    #: its socket's (abstract) name
    name: str
    python: str
    env: dict[str, str]
    used: bool = False

    def hand(self, plan_path: Path, torchrun: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen | None:
        """Give the server its launch: it takes ``env`` and starts ``torchrun`` (the rank programs'
        command, through this server's socket). None where it cannot serve this launch (used
        already, gone, another interpreter, or a variable it started with changed since: only
        ones added while the launcher planned may differ, set by loading the scenarios, which
        the server did too): start one as before."""
        changed = any(env.get(k) != v for k, v in self.env.items())
        if self.used or self.proc.poll() is not None or changed or torchrun[0] != self.python:
            return None
        line = json.dumps({"plan": str(plan_path), "torchrun": torchrun, "log": str(log), "env": env})
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.close()
        except OSError:
            return None
        self.used = True
        return self.proc

    def close(self) -> None:
        """A server no launch took: ended at once (it started nothing yet; waiting for it to
        read the end of its input would hold a run that failed in planning for its imports)."""
        if self.used:
            return
        self.used = True
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def started(config: RunConfig, python: str = sys.executable, python_path: list[str] | None = None
            ) -> Iterator[Prestarted | None]:
    """A server for the run's first CPU launch, started now, ended at the end if unused;
    None where the launch would start cold (``--cold-start``, several nodes, no CPU cell)."""
    if "cpu" not in config.devices or not warm(config, "cpu"):
        yield None
        return
    from harness.process import tree

    workers, paths = worker_paths(config, list(python_path or []))
    env = launch_env(paths)
    dirs = [str(Path(d).resolve()) for d in config.scenario_dirs]
    name = f"fsdp-compat-early-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    patches = workers.patches if installs_patches(config.variants, config.init) else None
    warmth = {"scenario_dirs": dirs, "select": list(config.scenarios), "patches": patches}
    cmd = [python, "-m", "harness.launch.forkserver", "serve", "--socket", name, "--prestart", json.dumps(warmth), "--"]
    server = Prestarted(proc=tree.start(cmd, env=env, cwd=PROJECT_ROOT, log=Path(os.devnull), stdin=subprocess.PIPE),
                        name=name, python=python, env=env)
    try:
        yield server
    finally:
        server.close()


def await_launch(warmth: dict, start: Callable[[list[str]], Any]) -> tuple[str, Any, tuple[list[str], object]]:
    """In the server: load the scenarios and import what any launch of the run needs (``warmth``,
    from ``started``: the requirements of the scenarios it selected, and where it may install
    patches every module a patch may touch and the patches module's probed code, compiled), then
    wait for the launch. The launch is taken as soon as it comes, between those steps too: its
    torchrun is started then (``start``), so that torchrun's agent and rank programs start while
    this server still imports. Returns the plan's path, the started torchrun and the loaded
    scenarios (with their folders). No line (the launcher closed it unused): exit."""
    from harness.rank.phases import CLOCK
    from harness.rank.worker import import_requirements, precompile_patches, selected_requirements
    from harness.scenario.load import load_scenarios
    from harness.undertest.undo import preload

    scenario_dirs = warmth["scenario_dirs"]
    with CLOCK.timed("scenarios"):
        library = load_scenarios(scenario_dirs)
    steps = [lambda: import_requirements(selected_requirements(library.scenarios, warmth["select"]))]
    if warmth["patches"] is not None:  # the probed code compiled after every import: its scan of them is complete
        steps += [preload, lambda: precompile_patches(True, warmth["patches"])]
    launch = run = None
    for step in steps:
        if launch is None and select.select([sys.stdin], [], [], 0)[0]:
            launch, run = _take_launch(start)
        with CLOCK.timed("preload"):
            step()
    if launch is None:
        launch, run = _take_launch(start)
    return launch["plan"], run, (scenario_dirs, library)


def _take_launch(start: Callable[[list[str]], Any]) -> tuple[dict, Any]:
    """Read the launch's line (none: exit), take on its environment and log, start its torchrun."""
    from harness.rank.phases import CLOCK

    line = sys.stdin.readline()
    if not line:
        os._exit(0)
    CLOCK.skip()  # waiting for the launcher's plan: no one's work
    launch = json.loads(line)
    os.environ.clear()
    os.environ.update(launch["env"])  # torchrun and the ranks start with what a launch's server would give them
    out = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for target in (1, 2):
        os.dup2(out, target)
    os.close(out)
    return launch, start(launch["torchrun"])


class Forked:
    """A child forked from this process, as the server's loop uses a ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def torchrun_forked(torchrun: list[str], listener: socket.socket, preexec) -> Forked | None:
    """``python -m torch.distributed.run ARGS`` run by torchrun's ``main`` in a child forked from
    this server, which imported torch already; None where ``torchrun`` is another command (or
    another interpreter's). The child holds none of the server's sockets, runs ``preexec`` first
    (its death signal), and ends as the interpreter would: 0, ``SystemExit``'s code, or the
    traceback of what ``main`` raised (torchrun's failure summary) and 1."""
    if torchrun[:3] != [sys.executable, "-m", "torch.distributed.run"]:
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        listener.close()
        preexec()
        collector.settle()  # the server may still be warming up with its collector paused: torchrun's agent lives on
        sys.argv = ["torchrun", *torchrun[3:]]
        from torch.distributed.run import main

        main(torchrun[3:])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
