"""Cell records: the one typed ``Record``, written as one JSON line per cell, and read back.

Rank 0 of a launch writes the records of cells that finished (pass, mismatch, error,
skip, or a hang seen from inside); the launcher writes those of cells whose launch hung
or died. Both go through ``new_record`` / ``finish`` / ``append``. The field list below
is the schema (``SCHEMA`` is its version); ``Record.from_json`` checks each field's type
against it, so the report and the verdicts read typed records only.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from harness.results.machine import environment, torch_info
from harness.results.outcome import CellOutcome
from harness.vocabulary import FAILING, INSTALL_STATUSES, STATUSES, VARIANTS, format_statuses, match_for, parse_statuses

__all__ = ["SCHEMA", "Record", "RecordError", "append", "finish", "append_line", "new_record"]

SCHEMA = 2
#: older schemas this code still reads (fields they lack take their defaults)
READABLE_SCHEMAS = (1, 2)


class RecordError(ValueError):
    """A line that is not a valid record (the message says why)."""


@dataclass(kw_only=True)
class Record(CellOutcome):
    """What one cell did: the cell as planned, its outcome (``CellOutcome``: the fields it
    inherits) and its environment. ``expected`` holds the statuses the cell may end with."""

    schema: int = SCHEMA
    run_id: str
    launch_id: str = ""
    cell: int = 0
    started_at: str
    scenario: str
    variant: str
    device: str
    backend: str = ""
    world_size: int
    mesh: list[int] = field(default_factory=list)
    torch: str
    torch_git: str | None = None
    patches_module: str = ""
    #: the module under test as the report names it: ``name [version] (sha256 12hex)``, never a path
    patches_module_id: str = ""
    #: the patches the scenario names (what the verdicts credit)
    patches: list[str] = field(default_factory=list)
    #: the patches this cell installed
    installed_patches: list[str] = field(default_factory=list)
    bug_observable: bool = True
    expected: tuple[str, ...]
    #: text the failure must contain: one, or one per status (``harness.scenario.expect.Expect.match``)
    expected_match: str | dict[str, str] | None = None
    as_expected: bool
    #: the patch that fixes the documented failure; the upstream issue of one no patch fixes
    fixed_by: str | None = None
    upstream: str | None = None
    #: the scenario's public API alternative and the patches it replaces
    api: str | None = None
    api_replaces: list[str] = field(default_factory=list)
    #: the seed of the shuffled cell order the run used (``run --shuffle``); None: the planned order
    order_seed: int | None = None
    #: "meta": the run built every model on the meta device (``run --init meta``, ``harness.train.meta_build``)
    init: str = "full"
    duration_s: float | None = None
    timeout_s: float | None = None
    env: dict[str, Any] = field(default_factory=dict)
    #: the cell's inputs, hashed (``harness.plan.inputs``): a later run reuses this record for a cell with the same
    inputs: str | None = None
    #: this record answers its cell from an earlier run's: that run's ``run_id`` and ``started_at``
    reused_from: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def install_errors(self) -> dict[str, str]:
        """Patch name -> reason, for every patch whose install failed."""
        return {n: e.get("reason", "") for n, e in self.patch_install.items() if e.get("status") == "error"}

    def outcome_matches(self) -> bool:
        """Whether the status (and, for a failure, its text) is the expected one. With a fault
        injected: a mismatch that flags every parameter the fault changed (a pass where it
        changed none)."""
        if self.status == "skip":
            return self.missing is None
        if self.fault is not None and self.status in ("pass", "mismatch"):
            return not self.fault_missed and (self.status == "mismatch") == bool(self.fault_affected)
        if self.status not in self.expected:
            return False
        if self.status == "mismatch" and self.symptom_seen is False:
            return False
        needle = match_for(self.expected_match, self.status) if self.status != "pass" else None
        if needle:
            return needle in f"{self.exc_msg or ''}\n{self.traceback or ''}\n{self.worst or ''}"
        return True

    def to_json(self) -> str:
        # a shallow dict: every field holds JSON's own types (``asdict``'s deep copy cost 4 ms a record)
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["expected"] = format_statuses(self.expected)
        return json.dumps(data, default=str)

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> Record:
        """Parse and check one record; ``RecordError`` says what is wrong."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise RecordError(f"bad JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object, got {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in _FIELDS}
        for name, (kind, required) in _FIELDS.items():
            if name not in known:
                if required:
                    raise RecordError(f"missing key {name!r}")
            elif (problem := _type_problem(name, known[name], kind)) is not None:
                raise RecordError(problem)
        if known["status"] not in STATUSES:
            raise RecordError(f"unknown status {known['status']!r}")
        try:
            known["expected"] = parse_statuses(known["expected"])
        except ValueError as exc:
            raise RecordError(f"key 'expected': {exc}") from None
        rec = cls(**known)
        if (problem := rec._value_problem()) is not None:
            raise RecordError(problem)
        return rec

    def _value_problem(self) -> str | None:
        if self.schema not in READABLE_SCHEMAS:
            return f"unsupported schema {self.schema!r}"
        if self.variant not in VARIANTS:
            return f"unknown variant {self.variant!r}"
        if self.status not in STATUSES:
            return f"unknown status {self.status!r}"
        if not all(isinstance(p, str) for p in self.patches):
            return "key 'patches' should be a list of str"
        for name, entry in self.patch_install.items():
            if not isinstance(entry, dict) or entry.get("status") not in INSTALL_STATUSES:
                return f"bad patch_install entry for {name!r}"
        return None


def _field_kinds() -> dict[str, tuple[Any, bool]]:
    hints = typing.get_type_hints(Record)
    return {
        f.name: (hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(Record)
    }


def _type_problem(name: str, value: Any, kind: Any) -> str | None:
    allowed = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    for t in allowed:
        base = typing.get_origin(t) or t
        if t is type(None) and value is None:
            return None
        if base is tuple and isinstance(value, str):  # "a|b" on disk
            return None
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if base is Any or (isinstance(base, type) and isinstance(value, base) and not (base is int and isinstance(value, bool))):
            return None
    wanted = "/".join((typing.get_origin(t) or t).__name__ for t in allowed if t is not type(None))
    return f"key {name!r} should be {wanted}, got {type(value).__name__}"


_FIELDS = _field_kinds()


# --------------------------------------------------------------------------- writing


def new_record(cell, outcome: CellOutcome, *, run_id: str, launch_id: str, patches_module: str, t0: float,
               patches_module_id: str = "", order_seed: int | None = None) -> Record:
    """The record of ``cell`` (a ``harness.plan.cells.Cell``): the cell, ``outcome``, this
    process's torch and machine. The outcome's reason, else the cell's own."""
    info = torch_info()
    outcome_fields = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(CellOutcome)}
    return Record(
        **outcome_fields | dict(reason=outcome.reason or cell.why or None),
        run_id=run_id, launch_id=launch_id, cell=cell.index,
        started_at=datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(timespec="seconds"),
        scenario=cell.scenario, variant=cell.variant, device=cell.device, backend=cell.backend,
        world_size=cell.world_size, mesh=list(cell.mesh), torch=info["torch"] or "", torch_git=info["torch_git"],
        patches_module=patches_module, patches_module_id=patches_module_id, patches=list(cell.scenario_patches),
        installed_patches=list(cell.patches), bug_observable=cell.bug_observable,
        expected=tuple(cell.expected), expected_match=cell.expected_match, as_expected=False,
        fixed_by=cell.fixed_by, upstream=cell.upstream, api=cell.api, api_replaces=list(cell.api_replaces),
        timeout_s=cell.timeout_s, env=environment(), init=cell.init, order_seed=order_seed,
        inputs=getattr(cell, "inputs", "") or None,
    )


def finish(rec: Record, t0: float) -> Record:
    """Fill the duration and whether the outcome is the expected one."""
    rec.duration_s = round(time.time() - t0, 3)
    rec.as_expected = rec.outcome_matches()
    return rec


def append(path: str | os.PathLike, *recs: Record) -> None:
    """Append records (in one write) and force them to disk before returning."""
    if recs:
        append_line(path, "\n".join(rec.to_json() for rec in recs), sync=True)


def append_line(path: str | os.PathLike, line: str, *, sync: bool = False) -> None:
    """Append one whole line (or several joined by newlines); several processes may append to
    one file at once (a launch's slots do), so they go in one ``write`` under an exclusive lock."""
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        while data:
            data = data[os.write(fd, data):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
