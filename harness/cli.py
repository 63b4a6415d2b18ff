"""Command line: ``python -m harness list|run|repro|report|diff|prerelease|blind-spots`` (or ``fsdp-compat``).

This module owns all argument parsing; the commands call plain functions. Bad input
(unknown scenario, unsupported world size, bad device, missing patches module) gets one
line on stderr and exit code 2. ``run`` and ``repro`` exit 1 when a cell's outcome is
not the expected one, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from functools import partial
from pathlib import Path

from harness import console
from harness.results.record import RecordError
from harness.runconfig import add_arguments, from_namespace, positive
from harness.undertest.locations import caller_folder_importable
from harness.vocabulary import VARIANTS

__all__ = ["main"]

EXIT_UNEXPECTED = 1
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    caller_folder_importable()
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RecordError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


# --------------------------------------------------------------------------- options


class _Parser(argparse.ArgumentParser):
    """Usage mistakes: one line on stderr, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"error: {self.prog.split()[-1]}: {message}\n")


#: what ``list``, ``run`` and ``repro`` share: the extra scenario folders
_SCENARIO_OPTIONS = ("scenario_dirs",)
#: what ``run`` and ``repro`` share: the patches module under test and the cell timeout
_CELL_OPTIONS = ("patches", "patch_mapping", "timeout_s")


def _options(names: tuple[str, ...]) -> argparse.ArgumentParser:
    add_arguments(p := _Parser(add_help=False), only=names)
    return p


def _parser() -> argparse.ArgumentParser:
    prog = "fsdp-compat" if Path(sys.argv[0]).name == "fsdp-compat" else "python -m harness"
    p = _Parser(prog=prog, description="FSDP2 patch compatibility harness")
    sub = p.add_subparsers(dest="command", required=True)
    scen, cell = _options(_SCENARIO_OPTIONS), _options(_CELL_OPTIONS)

    sub.add_parser("list", parents=[scen], help="list the scenarios").set_defaults(func=_cmd_list)
    sub.add_parser("bugs", help="print the bug legend (Markdown)").set_defaults(func=_cmd_bugs)

    run = sub.add_parser("run", help="run scenario cells under torchrun and judge them")
    add_arguments(run)  # every run option (``harness.runconfig.RunConfig``)
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.add_argument("--hold", action="store_true",
                     help="plan, then wait for a line on standard input before writing anything or starting a cell "
                          "(its end: exit 0, nothing written); nox -s matrix starts the next version's run so")
    run.add_argument("--allow-missing", action="store_true",
                     help="a local run: cells skipped for lack of a package or GPUs do not make the exit code 1 "
                          "(they stay not as documented in the records)")
    run.set_defaults(func=_cmd_run)

    rp = sub.add_parser("repro", parents=[scen, cell], help="reproduce one cell here; --export writes a standalone script")
    rp.add_argument("scenario")
    rp.add_argument("--world-size", type=positive, default=None, help="default: 2 where supported, else the smallest")
    rp.add_argument("--variant", choices=VARIANTS, default="vanilla")
    rp.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    rp.add_argument("--export", default=None, metavar="PATH", help="also write a standalone script that needs only torch")
    rp.add_argument("--out", default=None, help="keep the record in this file (JSON lines, appended)")
    rp.set_defaults(func=_cmd_repro)

    rep = sub.add_parser("report", help="build compat.{md,html,csv} from records")
    rep.add_argument("--records", nargs="+", action="extend", metavar="PATH", help=".jsonl files or folders (default: runs)")
    rep.add_argument("--out", default="reports", metavar="DIR", help="output folder (default: reports)")
    rep.add_argument("--stacks", default=None, metavar="DIR",
                     help="records of `harness stacks run` (e.g. runs/stacks): adds the Public stacks section")
    rep.set_defaults(func=_cmd_report)

    df = sub.add_parser("diff", help="what changed between two runs (records or compat.csv); exit 1 if anything got worse")
    df.add_argument("old", help="records (.jsonl file or folder) or a report's compat.csv")
    df.add_argument("new", help="records (.jsonl file or folder) or a report's compat.csv")
    df.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here")
    df.add_argument("--strict", action="store_true",
                    help="exit 1 on any verdict change, better or worse (e.g. a run against its --shuffle rerun)")
    df.set_defaults(func=_cmd_diff)

    pre = sub.add_parser("prerelease", help="the pre-release lane: newest stable torch -> each pre-release torch of "
                                            "the records; exit 1 if a candidate got worse")
    pre.add_argument("--records", nargs="+", action="extend", metavar="PATH", help=".jsonl files or folders (default: runs)")
    pre.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here (empty: no pre-release)")
    pre.set_defaults(func=_cmd_prerelease)

    st = sub.add_parser("stacks", help="public training stacks (stacks/): fetch their wheels, or judge their patch "
                                       "functions on the torch installed here")
    st.add_argument("action", choices=("fetch", "run", "list"))
    st.add_argument("--stack", action="append", default=None, metavar="NAME", help="run only this stack (repeatable)")
    st.add_argument("--out", default="runs/stacks", metavar="DIR", help="records folder (default: runs/stacks)")
    st.add_argument("--cache", default=None, metavar="DIR", help="where wheels are unpacked (default: runs/stacks/wheels)")
    st.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    st.set_defaults(func=_cmd_stacks)

    bs = sub.add_parser("blind-spots", help="what faults injected by run --fault went unnoticed, per scenario; "
                                            "exit 1 if any")
    bs.add_argument("records", nargs="+", help=".jsonl files or folders of runs with --fault")
    bs.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here")
    bs.set_defaults(func=lambda args: _record_commands().blind_spots(args.records, out=args.out))
    return p


# --------------------------------------------------------------------------- commands


def _cmd_bugs(args: argparse.Namespace) -> int:
    from harness.bugs import legend_markdown

    print(legend_markdown(), end="")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from harness.scenario.load import load_scenarios

    rows = [(s.name, ",".join(map(str, s.world_sizes)), ",".join(s.devices), ",".join(s.patches) or "-", s.summary)
            for s in load_scenarios(args.scenario_dirs or []).scenarios.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, sizes, devices, patches, summary in rows:
        print(f"{name:<{widths[0]}}  w={sizes:<{widths[1]}}  {devices:<{widths[2]}}  {summary}\n"
              f"{'':<{widths[0]}}  patches: {patches}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.launch.prestart import in_background, started

    config = from_namespace(args)
    progress = None if args.quiet else console.Progress()
    restore = in_background() if args.hold else None  # before the server starts: it starts as low
    try:
        with _interruptible(), started(config) as server:  # the server imports torch while this process plans
            from harness.launch.pipeline import run

            hold = partial(_await_go, progress, restore, server) if args.hold else None
            result = run(config, on_start=None if args.quiet else partial(console.say_start, shuffle=args.shuffle),
                         on_record=progress, prestarted=server, hold=hold,
                         on_load_error=lambda e: print(f"error: {e} (the scenario is recorded as an error and "
                                                       f"skipped)", file=sys.stderr, flush=True),
                         on_warning=lambda w: print(f"warning: {w}", file=sys.stderr, flush=True))
    except _NotLetGo:
        return 0
    except _Interrupted as stop:
        print(f"interrupted by {signal.Signals(stop.signum).name} before any cell ran", flush=True)
        return 128 + stop.signum
    late: list[int] = []  # a signal after the launcher let go: the records are on disk, finish the summary
    with _interruptible(lambda signum, frame: late.append(signum)):
        console.print_summary(result.records, shuffle=args.shuffle)
    if result.signal is not None or late:
        result.signal = result.signal or late[0]
        name = signal.Signals(result.signal).name
        print(f"\ninterrupted by {name}: {len(result.records)} cells recorded, {len(result.not_run)} not run; "
              f"every process of the run has ended", flush=True)
        return 128 + result.signal
    missing = [r for r in result.records if r.status == "skip" and r.missing]
    if missing:
        lacked = ", ".join(sorted({r.missing or "" for r in missing}))
        print(f"{len(missing)} cells not run for lack of {lacked}" + (" (--allow-missing: not counted)"
              if args.allow_missing else ": not as documented (--allow-missing for a local run)"))
    counted = [r for r in result.records if not (args.allow_missing and r in missing)]
    return EXIT_UNEXPECTED if any(not r.as_expected for r in counted) else 0


class _NotLetGo(Exception):
    """``--hold``: the input ended before a line came."""


def _await_go(progress: console.Progress | None, restore, server) -> None:
    """``--hold``: wait for a line on standard input; then this process and its server are back
    at the priority they started with (``prestart.in_background``), and the progress clock starts."""
    print("planned; held until a line comes on standard input (--hold)", file=sys.stderr, flush=True)
    if not sys.stdin.readline():
        raise _NotLetGo
    if restore is not None:
        restore([server.proc.pid] if server is not None else [])
    if progress is not None:
        progress.t0 = time.time()


def _cmd_repro(args: argparse.Namespace) -> int:
    from harness.repro.local import ReproRequest, format_report, launch_hint, repro

    req = ReproRequest(scenario=args.scenario, world_size=args.world_size, variant=args.variant, device=args.device,
                       config=from_namespace(args), export=Path(args.export) if args.export else None,
                       keep=args.out is not None)
    rec = repro(req)
    if req.export is not None:
        print(f"wrote {req.export} (needs only torch): {launch_hint(req.export, rec.world_size)}")
    print(format_report(rec, rerun=console.rerun_command(req, rec.world_size)))
    return 0 if rec.as_expected else EXIT_UNEXPECTED


def _cmd_stacks(args: argparse.Namespace) -> int:
    from harness.launch import stacks
    from harness.undertest.stacks import DEFAULT_CACHE, load_stacks

    cache = Path(args.cache) if args.cache else DEFAULT_CACHE
    if args.action == "list":
        for stack in load_stacks(stacks.STACKS_DIR):
            for j in stack.judged:
                print(f"{stack.label:24} {j.function:48} bug {j.bugs:6} as {j.patch} in {', '.join(j.scenarios)}")
        return 0
    if args.action == "fetch":
        return 1 if stacks.fetch_all(cache=cache) else 0
    return stacks.run_all(Path(args.out), cache=cache, device=args.device, only=args.stack)


def _cmd_report(args: argparse.Namespace) -> int:
    return _record_commands().report(args.records or ["runs"], args.out, stacks=args.stacks)


def _cmd_diff(args: argparse.Namespace) -> int:
    return _record_commands().diff(args.old, args.new, out=args.out, strict=args.strict)


def _cmd_prerelease(args: argparse.Namespace) -> int:
    return _record_commands().prerelease(args.records or ["runs"], out=args.out)


def _record_commands():
    """``harness.results.commands``, once what it needs is known to be installed."""
    import importlib.util

    missing = [m for m in ("pandas", "tabulate", "jinja2") if importlib.util.find_spec(m) is None]
    if missing:  # one line naming what is missing, instead of a traceback (e.g. in a torch-only venv)
        raise ValueError(f"this needs {', '.join(missing)}, missing in {sys.executable}: "
                         f"pip install {' '.join(missing)} (or run it through nox -s report)")
    from harness.results import commands

    return commands


# --------------------------------------------------------------------------- output


class _Interrupted(Exception):
    @property
    def signum(self) -> int:
        return self.args[0]


def _interruptible(handler=None) -> contextlib.AbstractContextManager[None]:
    """SIGINT/SIGTERM before the launcher takes over: stop at once, with one line (or ``handler``)."""
    from harness.process.tree import on_stop_signals

    def stop(signum, frame):
        raise _Interrupted(signum)

    return on_stop_signals(handler or stop)
