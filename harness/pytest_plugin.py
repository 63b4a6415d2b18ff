"""pytest plugin: the harness's cells as pytest items.

    python -m pytest --fsdp-compat [--fsdp-compat-patches MODULE] [-k ...] [-n N] [--junitxml FILE]

With ``--fsdp-compat`` pytest collects one item per cell, ``scenario[variant,device,wN]``,
and nothing else. A cell documented to fail is ``xfail(strict=True)``: it shows as
xfailed when it fails as documented, and an XPASS (the cell passed) fails the run: the
signal that a bug was fixed upstream. Any other unexpected outcome is a failure; a
skipped cell is skipped. JUnit XML comes from pytest's own ``--junitxml``.

Cells still run batched: the first item of a (device, world size) group that a worker
runs launches every cell of that group, in one torchrun. Under pytest-xdist the groups
are kept whole on one worker (``--dist loadgroup``; node ids end in ``@cpu-w2``), and each
worker takes a disjoint slice of the GPUs (``harness.process.gpus``). The records go to
``--fsdp-compat-out`` (one file per worker under xdist).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.vocabulary import DEFAULT_MODULE, DEVICES, VARIANTS

__all__ = ["CellItem"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsdp-compat", "FSDP2 patch compatibility cells")
    group.addoption("--fsdp-compat", action="store_true", help="collect the harness's cells (and nothing else)")
    group.addoption("--fsdp-compat-patches", default=DEFAULT_MODULE, metavar="MODULE",
                    help="patches module under test: dotted name or .py path")
    group.addoption("--fsdp-compat-patch-map", action="append", default=[], metavar="NAME=FUNC")
    group.addoption("--fsdp-compat-scenario", action="append", default=[], metavar="NAME",
                    help="only these scenarios (default: all; -k filters the cells further)")
    group.addoption("--fsdp-compat-device", action="append", default=[], choices=DEVICES)
    group.addoption("--fsdp-compat-world-size", action="append", type=int, default=[])
    group.addoption("--fsdp-compat-variant", action="append", default=[], choices=VARIANTS)
    group.addoption("--fsdp-compat-timeout", type=float, default=None, metavar="SECONDS")
    group.addoption("--fsdp-compat-scenarios-dir", action="append", default=[])
    group.addoption("--fsdp-compat-out", default=None, metavar="FILE", help="records file (default runs/pytest-*.jsonl)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("fsdp_compat"):
        return
    config.addinivalue_line("markers", "fsdp_compat: a cell of the FSDP2 patch compatibility harness")
    if getattr(config.option, "dist", "no") in _SPLITTING:
        config.option.dist = "loadgroup"  # a (device, world size) group runs as one launch on one worker


_SPLITTING = ("load", "loadscope", "loadfile", "worksteal")  # xdist modes that could split a group


def _group(cell: Any) -> str:
    return f"{cell.device}-w{cell.world_size}"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if config.getoption("fsdp_compat") else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if not config.getoption("fsdp_compat"):
        return
    from harness.options import parse_mapping
    from harness.plan.cells import all_patch_names, plan_cells
    from harness.scenario.load import load_scenarios, select
    from harness.undertest.source import check_patch_names, deployed_patches, locate

    opt = config.getoption
    library = load_scenarios(opt("fsdp_compat_scenarios_dir"))
    source = locate(opt("fsdp_compat_patches"))
    mapping = parse_mapping(opt("fsdp_compat_patch_map"))
    everything = list(library.scenarios.values())
    scenarios = select(library.scenarios, opt("fsdp_compat_scenario"))
    check_patch_names({s.name: s.patches for s in scenarios}, [source], mapping)
    cells = plan_cells(scenarios, world_sizes=opt("fsdp_compat_world_size") or None,
                       devices=opt("fsdp_compat_device") or ["cpu"], variants=opt("fsdp_compat_variant") or list(VARIANTS),
                       explicit_scenarios=False, timeout_s=opt("fsdp_compat_timeout"),
                       deployed_patches=deployed_patches(all_patch_names(everything), source, mapping))
    batch = _Batch(config=config, source=source, mapping=mapping)
    # the controller schedules by the node id's "@group" suffix (--dist loadgroup, set in
    # pytest_configure); the suffix goes into the item's name, since pytest >= 9.2 no longer
    # lets a plugin (or xdist's own xdist_group marker) rewrite a node id after collection
    under_xdist = hasattr(config, "workerinput")
    for cell in cells:
        name = f"{cell.label}@{_group(cell)}" if under_xdist else cell.label
        item = CellItem.from_parent(session, name=name, cell=cell, batch=batch)
        item.add_marker(pytest.mark.fsdp_compat)
        if "pass" not in cell.expected:
            item.add_marker(pytest.mark.xfail(strict=True, raises=DocumentedFailure,
                                              reason=cell.why or f"documented: {'|'.join(cell.expected)}"))
        items.append(item)
    for error in library.errors:
        items.append(LoadErrorItem.from_parent(session, name=f"{error.name}[load]", error=str(error)))


class DocumentedFailure(Exception):
    """The cell failed the way its scenario documents."""


class UnexpectedOutcome(Exception):
    """The cell's outcome is not the documented one."""


class _Batch:
    """Runs the cells of a (device, world size) group, once, in one launch, on the worker that holds the group."""

    def __init__(self, *, config: pytest.Config, source: Any, mapping: dict[str, str]) -> None:
        self.config, self.source, self.mapping = config, source, mapping
        self.records: dict[int, Any] = {}
        self.done: set[tuple[str, int]] = set()

    def record_of(self, item: CellItem) -> Any:
        key = (item.cell.device, item.cell.world_size)
        if key not in self.done:
            self.done.add(key)
            mine = [i.cell for i in item.session.items if isinstance(i, CellItem)
                    and (i.cell.device, i.cell.world_size) == key]
            self._run(mine)
        return self.records.get(item.cell.index)

    def _run(self, cells: list) -> None:
        import os

        from harness.launch.launcher import LaunchOptions, run_cells

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out = self.config.getoption("fsdp_compat_out")
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out_path = Path(out).with_name(f"{Path(out).stem}-{worker}.jsonl") if out and worker != "main" else \
            Path(out or f"runs/pytest-{stamp}-{worker}.jsonl")
        opts = LaunchOptions(run_id=f"pytest-{stamp}-{worker}", out_path=out_path,
                             log_dir=out_path.parent / f"{out_path.stem}.logs",
                             patches_module=self.config.getoption("fsdp_compat_patches"),
                             patches_module_id=self.source.describe(), patch_mapping=self.mapping,
                             scenario_dirs=self.config.getoption("fsdp_compat_scenarios_dir"), per="world-size")
        result = run_cells(cells, opts)
        if result.signal is not None:
            raise KeyboardInterrupt
        self.records.update({r.cell: r for r in result.records})


class CellItem(pytest.Item):
    def __init__(self, *, cell: Any, batch: _Batch, **kw: Any) -> None:
        super().__init__(**kw)
        self.cell, self.batch = cell, batch

    def runtest(self) -> None:
        rec = self.batch.record_of(self)
        if rec is None:
            raise UnexpectedOutcome(f"{self.cell.label}: no record")
        if rec.status == "skip":
            pytest.skip(rec.reason or "skipped")
        detail = rec.exc_msg or rec.worst or ""
        if rec.status == "pass":
            return  # for a documented failure: XPASS(strict), the sign of an upstream fix
        if not rec.as_expected:
            raise UnexpectedOutcome(f"{rec.status}, expected {'|'.join(rec.expected)}: {detail}")
        if rec.failed:
            raise DocumentedFailure(f"{rec.status} as documented: {detail}")

    def repr_failure(self, excinfo, style=None) -> str:
        if isinstance(excinfo.value, (UnexpectedOutcome, DocumentedFailure)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int, str]:
        return f"scenarios/{self.cell.scenario}.py", 0, self.cell.label


class LoadErrorItem(pytest.Item):
    def __init__(self, *, error: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.error = error

    def runtest(self) -> None:
        raise UnexpectedOutcome(f"scenario file failed to load: {self.error}")

    def repr_failure(self, excinfo, style=None) -> str:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[str, int, str]:
        return self.name, 0, self.name
