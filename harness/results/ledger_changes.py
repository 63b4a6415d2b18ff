"""Where the collective ledger (``harness.train.ledger``) of a cell changes: from one torch
release to the next (the report's "Collective changes between torch versions") and between
two runs (``harness diff``).

A ledger is compared in summary: per kind and phase ("reduce_scatter backward"), the
collectives and bytes over the whole run and the dtypes they moved. A changed dtype, count
or byte total is one line, e.g. ``reduce_dtype_none_bf16 [vanilla, cpu, w2]: reduce_scatter
backward dtype bfloat16 → float32 at 2.15``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.versions import release

__all__ = ["CellKey", "Summary", "describe", "ledger_summaries", "run_changes", "summarise", "version_changes"]

#: (device, scenario, world_size, torch, variant)
CellKey = tuple[str, str, int, str, str]


@dataclass(kw_only=True, frozen=True)
class Usage:
    """Collectives of one kind in one phase, over every step of a cell."""

    count: int
    bytes: int
    dtypes: tuple[str, ...]


#: "kind phase" -> usage
Summary = Mapping[str, Usage]


def summarise(rows: Iterable[list[Any]]) -> dict[str, Usage]:
    """The summary of a stored ledger (``Record.ledger`` rows)."""
    acc: dict[str, tuple[int, int, set[str]]] = {}
    for _step, _k, phase, kind, _group, dtype, count, nbytes in rows:
        c, b, d = acc.get(f"{kind} {phase}", (0, 0, set()))
        acc[f"{kind} {phase}"] = (c + count, b + nbytes, d | {dtype})
    return {key: Usage(count=c, bytes=b, dtypes=tuple(sorted(d))) for key, (c, b, d) in sorted(acc.items())}


def ledger_summaries(records: Iterable[Any]) -> dict[CellKey, dict[str, Usage]]:
    """Summaries of the records that carry a ledger, by cell and variant (one record each)."""
    return {(r.device, r.scenario, int(r.world_size), str(release(r.torch)), r.variant): summarise(r.ledger)
            for r in records if r.ledger is not None}


def describe(before: Summary, after: Summary) -> list[str]:
    """What changed from ``before`` to ``after``, one phrase per kind and phase."""
    out = []
    for key, what, numbers in _changes(before, after):
        if what in ("new", "gone"):
            out.append(f"{key} {what} ({numbers})")
        elif what.startswith("dtype"):
            out.append(f"{key} {what}" + (f", {numbers}" if numbers else ""))
        else:
            out.append(f"{key} {numbers}")
    return out


def _where(device: str, scenario: str, world_size: int, variant: str) -> str:
    return f"{scenario} [{variant}, {device}, w{world_size}]"


def version_changes(ledgers: Mapping[CellKey, Summary]) -> list[str]:
    """Each change of torch's collectives from one release to the next, stated once with the
    cells it shows in: ``reduce_scatter backward dtype bfloat16 → float32 at 2.15.0 (from
    2.14.1), 2 cells: reduce_dtype_none_bf16 [deployed, vanilla; cpu, w2] (bytes 1968 →
    3936)``. A change is grouped by what changed (a kind and phase gone or new, a dtype change)
    and the two releases; per-cell numbers (counts, bytes) follow the cell they belong to. A
    change seen in more than ``_LISTED`` cells names where (device, world size) and its
    scenarios only: ``all_gather forward gone at 2.9.1 (from 2.8.0), 91 cells at cpu w1, cpu w2,
    in 41 scenarios: b1_mixed_dtype_unused_api, ...``."""
    by_cell: dict[tuple[str, str, int, str], dict[str, Summary]] = {}
    for (device, scenario, ws, torch, variant), summary in ledgers.items():
        by_cell.setdefault((device, scenario, ws, variant), {})[torch] = summary
    groups: dict[tuple[str, str, str], dict[tuple[str, str, int, str], list[str]]] = {}
    for (device, scenario, ws, variant), versions in by_cell.items():
        ordered = sorted(versions, key=release)
        for old, new in zip(ordered, ordered[1:]):
            for key, what, detail in _changes(versions[old], versions[new]):
                cells = groups.setdefault((f"{key} {what}", new, old), {})
                cells.setdefault((device, scenario, ws, detail), []).append(variant)
    out = []
    for (what, new, old), cells in sorted(groups.items(), key=lambda g: (release(g[0][1]), g[0][0])):
        n = sum(len(v) for v in cells.values())
        if n > _LISTED:  # one behaviour of torch: where it shows, and the scenarios it touches by name
            where = ", ".join(f"{device} w{ws}" for device, ws in sorted({(d, w) for d, _, w, _ in cells}))
            names = sorted({scenario for _, scenario, _, _ in cells})
            out.append(f"{what} at {new} (from {old}), {n} cells at {where}, in {len(names)} scenarios: "
                       f"{', '.join(names)}")
            continue
        listed = [f"{scenario} [{', '.join(sorted(variants))}; {device}, w{ws}]" + (f" ({detail})" if detail else "")
                  for (device, scenario, ws, detail), variants in sorted(cells.items())]
        out.append(f"{what} at {new} (from {old}), {n} cell{'s' if n != 1 else ''}: {'; '.join(listed)}")
    return out


#: a change shown in more cells than this is stated with its scenarios' names only (each cell's
#: numbers: ``harness diff``, and the records' ledgers)
_LISTED = 6


def _changes(before: Summary, after: Summary) -> list[tuple[str, str, str]]:
    """(kind and phase, what changed, this cell's numbers) per kind and phase that changed:
    ``("all_gather forward", "gone", "was 4× bfloat16")``, ``("reduce_scatter backward",
    "dtype bfloat16 → float32", "bytes 400 → 800")``, ``("all_gather backward", "count and
    bytes", "count 4 → 7, bytes 400 → 700")``."""
    out = []
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key), after.get(key)
        if was is None:
            out.append((key, "new", f"{now.count}× {'/'.join(now.dtypes)}"))  # type: ignore[union-attr]
        elif now is None:
            out.append((key, "gone", f"was {was.count}× {'/'.join(was.dtypes)}"))
        else:
            numbers = [f"{label} {a} → {b}" for label, a, b in (("count", was.count, now.count),
                                                                ("bytes", was.bytes, now.bytes)) if a != b]
            if was.dtypes != now.dtypes:
                out.append((key, f"dtype {'/'.join(was.dtypes)} → {'/'.join(now.dtypes)}", ", ".join(numbers)))
            elif numbers:
                out.append((key, " and ".join(n.split()[0] for n in numbers), ", ".join(numbers)))
    return out


def run_changes(old: Mapping[CellKey, Summary], new: Mapping[CellKey, Summary]) -> list[str]:
    """Changes between two runs, cell by cell; when each run holds one torch release and they
    differ (an upgrade), cells are matched across the two releases."""
    releases = ({k[3] for k in old}, {k[3] for k in new})
    upgrade = len(releases[0]) == 1 and len(releases[1]) == 1 and releases[0] != releases[1]

    def key(k: CellKey) -> CellKey:
        return (*k[:3], "", k[4]) if upgrade else k
    a, b = {key(k): v for k, v in old.items()}, {key(k): v for k, v in new.items()}
    out = []
    for k in sorted(set(a) & set(b)):
        device, scenario, ws, torch, variant = k
        where = _where(device, scenario, ws, variant) + (f" on {torch}" if torch else "")
        out += [f"{where}: {change}" for change in describe(a[k], b[k])]
    return out
