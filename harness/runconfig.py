"""One run's configuration, declared once: ``RunConfig``.

Every run option is one field of ``RunConfig`` with its command-line flag, help, parser and
where it is offered (``Option``). ``harness run`` (``add_arguments`` / ``from_namespace``)
and the pytest plugin (``add_pytest_options`` / ``from_pytest``, as ``--fsdp-compat-<flag>``)
are both built from these declarations; the planning step (``harness.launch.pipeline.plan``)
and the launch (``harness.launch.launcher``) take the config as it is, and every rank reads
it from its launch plan (``LaunchPlan``'s ``config``, ``harness.protocol``). A new option is a field
here and the code that acts on it.

Bad values are a ``ValueError`` (or argparse's one-line error) naming the option.
"""

from __future__ import annotations

import argparse
import datetime
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.vocabulary import DEFAULT_MODULE, FAULT_NAMES, ISOLATIONS, VARIANTS

__all__ = ["Option", "RunConfig", "add_arguments", "add_pytest_options", "from_namespace", "from_pytest",
           "parse_mapping", "positive", "seconds"]

#: where an option is offered: ``harness run``, the pytest plugin
CLI, PYTEST = "cli", "pytest"


# --------------------------------------------------------------------------- value parsers


def seconds(text: str) -> float:
    """A timeout: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def parse_mapping(items: Iterable[str]) -> dict[str, str]:
    """``--patch-map NAME=FUNCTION`` items as a mapping."""
    mapping = {}
    for item in items:
        name, sep, func = item.partition("=")
        if not sep or not name or not func:
            raise ValueError(f"--patch-map expects NAME=FUNCTION, got {item!r}")
        mapping[name] = func
    return mapping


def _faults(items: list[str]) -> list[str]:
    return list(FAULT_NAMES) if "all" in items else list(dict.fromkeys(items))


# --------------------------------------------------------------------------- declarations


@dataclass(kw_only=True, frozen=True)
class Option:
    """How one ``RunConfig`` field is offered to users."""

    #: the command-line flag (``--world-size``); the pytest plugin offers ``--fsdp-compat-world-size``
    flag: str
    help: str
    #: parses one command-line value (argparse's ``type``)
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    #: the flag may be given again, each value added to a list
    repeat: bool = False
    #: a true/false flag that takes no value
    switch: bool = False
    metavar: str | None = None
    #: turns the parsed value (a list for a repeated flag) into the field's value
    convert: Callable[[Any], Any] | None = None
    #: where the option is offered
    where: tuple[str, ...] = (CLI, PYTEST)
    #: a titled group of the command line's help
    group: str | None = None


def _option(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, **how: Any) -> Any:
    """A field of ``RunConfig`` with the ``Option`` that offers it."""
    meta = {"option": Option(**how)}
    return field(default_factory=factory, metadata=meta) if factory is not None else field(default=default, metadata=meta)


_MULTI_NODE = "multi-node (passed to torchrun; run the same command on every node)"


@dataclass(kw_only=True)
class RunConfig:
    """What a run is: which cells, against which patches module, launched how."""

    #: scenario names; empty: every scenario of the library (and of ``scenario_dirs``)
    scenarios: list[str] = _option(factory=list, flag="--scenario", repeat=True, metavar="NAME",
                                   help="scenario name (repeatable; default: all)")
    #: world sizes to plan; empty: each scenario's own
    world_sizes: list[int] = _option(factory=list, flag="--world-size", repeat=True, parse=positive,
                                     help="world size (repeatable)")
    #: devices to plan cells for
    devices: list[str] = _option(factory=lambda: ["cpu"], flag="--device", repeat=True, metavar="DEVICE",
                                 help="cpu or cuda (repeatable; default cpu)")
    #: how each cell treats the patches module (``harness.vocabulary.VARIANTS``)
    variants: list[str] = _option(factory=lambda: list(VARIANTS), flag="--variant", repeat=True, choices=VARIANTS,
                                  help="vanilla, patched (the scenario's patches), deployed (every patch of the module) "
                                       "or api (the public API where torch has one); repeatable; default all")
    #: the patches module under test: a dotted name or a ``.py`` path
    patches: str = _option(DEFAULT_MODULE, flag="--patches", metavar="MODULE",
                           help="patches module under test: dotted name or .py path")
    #: patch name -> function of the module under test, where its names differ from the harness's
    patch_mapping: dict[str, str] = _option(factory=dict, flag="--patch-map", repeat=True, metavar="NAME=FUNC",
                                            convert=parse_mapping,
                                            help="map a patch name to a function of the module")
    #: the cell timeout for scenarios that set none (None: the harness's default, 30 s)
    timeout_s: float | None = _option(None, flag="--timeout", parse=seconds, metavar="SECONDS",
                                      help="per-cell timeout in seconds for scenarios that set none (default 30)")
    #: extra folders of scenario files
    scenario_dirs: list[str] = _option(factory=list, flag="--scenarios-dir", repeat=True,
                                       help="extra folder of scenario files")
    #: how cells are kept apart (``harness.plan.placement``)
    isolate: str = _option(ISOLATIONS[0], flag="--isolate", choices=ISOLATIONS,
                           help="cells share their rank's process and every change to torch is put back after each "
                                "(snapshot, the default); every CPU cell in a process forked from a pristine copy of "
                                "its rank (fork: C++ state too, slower); or like snapshot with a launch per patch set "
                                "(process)")
    #: "device": one launch per device (smaller world sizes on slots); "world-size": one per size
    per: str = _option("device", flag="--launch-per", choices=("device", "world-size"), where=(CLI,),
                       help="one launch per device, smaller world sizes on slots of its ranks (default), or one "
                            "launch per device and world size")
    #: CPU launches: slots of the largest world size side by side (``harness.plan.placement``)
    slots: int = _option(1, flag="--slots", parse=positive, metavar="N",
                         help="a CPU launch starts N times its largest world size and runs N cells of each size "
                              "where it ran one, up to a slot per 100 cells (default 1; cuda: a GPU per rank)")
    #: run the cells in a random order from this seed (``harness.plan.placement.stages``)
    shuffle: int | None = _option(None, flag="--shuffle", parse=int, metavar="SEED",
                                  help="run the cells in a random order from SEED (the same seed, the same order; "
                                       "recorded as order_seed): an outcome that changes with the order depends on "
                                       "an earlier cell")
    #: run every cell, even one whose inputs equal a record's in the records file (``harness.launch.incremental``)
    fresh: bool = _option(False, flag="--fresh", switch=True,
                          help="run every cell (default: a cell whose inputs are unchanged since an as-expected record "
                               "in the records file is answered by that record, marked reused_from)")
    #: records files to reuse from besides the records file itself (``harness.results.reusable.carry_over``)
    reuse_from: list[str] = _option(factory=list, flag="--reuse-from", repeat=True, metavar="FILE", where=(CLI,),
                                    convert=lambda given: [str(Path(p).resolve()) for p in given],
                                    help="also reuse records from FILE (nox -s matrix: the records this run replaces)")
    #: "meta": every model built on the meta device (``harness.train.meta_build``)
    init: str = _option("full", flag="--init", choices=("full", "meta"),
                        help="meta: build every model on the meta device, shard, to_empty, reset_parameters (with "
                             "meta_init_full_rng); a model that cannot be built so is skipped with the reason")
    #: faults to inject (``harness.train.faults``): each plans the cells documented to pass once more
    faults: list[str] = _option(factory=list, flag="--fault", repeat=True, choices=(*FAULT_NAMES, "all"),
                                convert=_faults,
                                help="inject a fault on the FSDP2 side of every cell documented to pass (repeatable; "
                                     "all: each in turn): each must become a mismatch naming every parameter it "
                                     "changed")
    #: pin each rank to a core where a launch has more ranks than cores (``harness.process.cpus``)
    pin_ranks: bool = _option(True, flag="--no-pin", switch=True, convert=lambda given: not given,
                              help="leave the ranks to the scheduler (default: each rank pinned to a core where a "
                                   "launch has more ranks than the machine has cores)")
    #: start every rank of a CPU launch on its own, not forked from a warm server (``harness.launch.forkserver``)
    cold_start: bool = _option(False, flag="--cold-start", switch=True,
                               help="start each rank of a CPU launch on its own (default: forked from one process that "
                                    "imported torch and the scenarios' needs once; ranks then share its hash seed)")
    #: keep each judged cell's observed tensors in this folder
    dump: Path | None = _option(None, flag="--dump", convert=Path, metavar="DIR",
                                help="save each judged cell's observed tensors in this folder")
    #: stop unless the installed torch is this release
    expect_torch: str | None = _option(None, flag="--expect-torch", metavar="X.Y.Z",
                                       help="stop (exit 2) unless the installed torch is this release")
    #: the records file (JSON lines, appended); None: ``runs/<run_id>.jsonl``
    out: Path | None = _option(None, flag="--out", convert=Path, metavar="FILE",
                               help="records file (JSON lines, appended); default runs/<run id>.jsonl")
    #: the run's id, the same on every node of a multi-node run; None: a timestamp
    run_id: str | None = _option(None, flag="--run-id", where=(CLI,), group=_MULTI_NODE,
                                 help="the same on every node (default: a timestamp)")
    #: nodes of a multi-node run (every node runs the same command)
    nnodes: int = _option(1, flag="--nnodes", parse=positive, where=(CLI,), group=_MULTI_NODE,
                          help="number of nodes")
    #: this node's rank
    node_rank: int = _option(0, flag="--node-rank", parse=int, where=(CLI,), group=_MULTI_NODE,
                             help="this node's rank")
    #: the rendezvous endpoint of a multi-node run
    rdzv_endpoint: str | None = _option(None, flag="--rdzv-endpoint", metavar="HOST:PORT", where=(CLI,),
                                        group=_MULTI_NODE, help="torchrun's rendezvous endpoint")

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}) with --nnodes {self.nnodes}")
        if self.nnodes > 1 and self.slots > 1:
            raise ValueError("--slots is for single-node runs")
        if self.nnodes > 1 and (not self.rdzv_endpoint or not self.run_id):
            raise ValueError("multi-node runs need --rdzv-endpoint HOST:PORT and the same --run-id on every node")
        self.run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") if self.run_id is None else self.run_id
        self.out = Path("runs") / f"{self.run_id}.jsonl" if self.out is None else self.out

    @property
    def records_file(self) -> Path:
        assert self.out is not None  # set in __post_init__
        return self.out

    @property
    def runs_everything(self) -> bool:
        """Takes nothing an earlier run measured, record or reference (``--fresh``, ``--shuffle``, ``--dump``)."""
        return self.fresh or self.shuffle is not None or self.dump is not None

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunConfig:
        return cls(**{**data, **{k: Path(data[k]) if data.get(k) else None for k in ("dump", "out")}})

    def with_(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (a launch's resolved paths, a pytest worker's records file)."""
        return replace(self, **changes)


def options(where: str) -> list[tuple[str, Option]]:
    """(field name, option) of every option offered ``where``, in declaration order."""
    return [(f.name, f.metadata["option"]) for f in fields(RunConfig)
            if "option" in f.metadata and where in f.metadata["option"].where]


def _from_values(values: Mapping[str, Any]) -> RunConfig:
    """A config from parsed values (field name -> value; None or [] where not given)."""
    given = {}
    for f in fields(RunConfig):
        opt = f.metadata.get("option")
        value = values.get(f.name)
        if opt is None or value is None or (opt.repeat and not value):
            continue  # the field's default
        given[f.name] = opt.convert(value) if opt.convert is not None else value
    return RunConfig(**given)


def _argparse_kwargs(name: str, opt: Option) -> dict[str, Any]:
    kw: dict[str, Any] = dict(dest=name, help=opt.help)
    if opt.switch:
        return {**kw, "action": "store_true"}
    kw.update(action="append" if opt.repeat else "store", default=None)
    given = {"type": opt.parse, "choices": None if opt.choices is None else list(opt.choices), "metavar": opt.metavar}
    return {**kw, **{k: v for k, v in given.items() if v is not None}}


# --------------------------------------------------------------------------- the command line


def add_arguments(parser: argparse.ArgumentParser, *, only: Iterable[str] | None = None) -> None:
    """The options offered on the command line (``only``: these fields), on ``parser``."""
    groups: dict[str, Any] = {}
    wanted = None if only is None else set(only)
    for name, opt in options(CLI):
        if wanted is not None and name not in wanted:
            continue
        target = parser if opt.group is None else groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        target.add_argument(opt.flag, **_argparse_kwargs(name, opt))


def from_namespace(args: argparse.Namespace) -> RunConfig:
    return _from_values(vars(args))


# --------------------------------------------------------------------------- the pytest plugin

PYTEST_PREFIX = "--fsdp-compat-"


def pytest_flag(opt: Option) -> str:
    return PYTEST_PREFIX + opt.flag.removeprefix("--")


def add_pytest_options(group: Any) -> None:
    """Every option offered to the pytest plugin, as ``--fsdp-compat-<flag>`` on ``group``."""
    for name, opt in options(PYTEST):
        kw = _argparse_kwargs(name, opt)
        kw["dest"] = f"fsdp_compat_{name}"
        group.addoption(pytest_flag(opt), **kw)


def from_pytest(config: Any) -> RunConfig:
    """The run configuration a pytest session's ``--fsdp-compat-*`` options give."""
    return _from_values({name: config.getoption(f"fsdp_compat_{name}") for name, _ in options(PYTEST)})
