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

__all__ = ["CellItem"]


def pytest_addoption(parser: pytest.Parser) -> None:
    from harness.runconfig import add_pytest_options

    group = parser.getgroup("fsdp-compat", "FSDP2 patch compatibility cells")
    group.addoption("--fsdp-compat", action="store_true", help="collect the harness's cells (and nothing else)")
    add_pytest_options(group)  # every run option the plugin offers (``harness.runconfig.RunConfig``)


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
    from harness.launch.pipeline import plan
    from harness.runconfig import from_pytest

    try:
        planned = plan(from_pytest(config))  # the same planning step as ``harness run``
    except ValueError as e:
        raise pytest.UsageError(f"fsdp-compat: {e}") from None
    cells = planned.cells
    batch = _Batch(config=config, planned=planned)
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
    for error in planned.broken:
        items.append(LoadErrorItem.from_parent(session, name=f"{error.name}[load]", error=str(error)))


class DocumentedFailure(Exception):
    """The cell failed the way its scenario documents."""


class UnexpectedOutcome(Exception):
    """The cell's outcome is not the documented one."""


class _Batch:
    """Runs the cells of a (device, world size) group, once, in one launch, on the worker that holds the group."""

    def __init__(self, *, config: pytest.Config, planned: Any) -> None:
        self.config, self.planned = config, planned
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

        from harness.launch.incremental import reuse
        from harness.launch.launcher import LaunchOptions, RunResult, run_cells

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        run = self.planned.config
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        given = self.config.getoption("fsdp_compat_out")
        out_path = Path(given).with_name(f"{Path(given).stem}-{worker}.jsonl") if given and worker != "main" else \
            Path(given or f"runs/pytest-{stamp}-{worker}.jsonl")
        # one launch per (device, world size) group: the group a pytest-xdist worker holds
        opts = LaunchOptions(config=run.with_(run_id=f"pytest-{stamp}-{worker}", out=out_path, per="world-size"),
                             patches_module_id=self.planned.module_id)
        opts.out_path.parent.mkdir(parents=True, exist_ok=True)
        reused, cells = reuse(cells, opts.config, opts.out_path, self.planned.module_path)
        result = run_cells(cells, opts) if cells else RunResult()
        if result.signal is not None:
            raise KeyboardInterrupt
        self.records.update({r.cell: r for r in [*reused, *result.records]})


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
