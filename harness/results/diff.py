"""What changed between two runs: ``python -m harness diff OLD NEW``.

OLD and NEW are records (``.jsonl`` files or folders of them) or a report's
``compat.csv`` (its ``compat-patches.csv`` beside it, when there, gives the per-patch
statuses). The result is Markdown for a CI job summary or a PR comment, and an exit
code: 1 when anything got worse (a cell newly broken, failing unexpectedly or gone, a
patch newly broken or not provided), 0 otherwise; with ``--strict``, 1 on any verdict
change, better or worse (two runs that should agree: ``run`` and ``run --shuffle``).

Error texts are compared after ``normalise_error`` (set order, rank numbers, addresses,
ports, line numbers, pids, folders and C++'s ``what():`` masked; the clauses per rank in
any order; a text cut at its length limit matches the same text cut elsewhere), so the
same error in two runs is no change; the lines show the texts as they were.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from packaging.version import Version

from harness.results.decisions import torch_source
from harness.results.ledger_changes import CellKey, Summary, run_changes
from harness.results.safe import read_report_csv
from harness.results.tables import ReportTables, build_tables
from harness.versions import is_prerelease, release_label, sorted_torch
from harness.vocabulary import (
    DEPLOYED_BROKEN,
    FIXED_UPSTREAM,
    NOT_PROVIDED,
    PATCH_BROKEN,
    PS_BROKEN,
    PS_NOT_PROVIDED,
    REGRESSION,
    VARIANTS,
)

__all__ = ["PrereleaseLane", "RunDiff", "diff_runs", "load_side", "normalise_error", "prerelease_lane", "same_error"]

KEY = ["device", "scenario", "world_size", "torch"]
BAD = {PATCH_BROKEN, DEPLOYED_BROKEN, REGRESSION, NOT_PROVIDED}
BAD_PATCH = {PS_BROKEN, PS_NOT_PROVIDED}


@dataclass(kw_only=True)
class Side:
    cells: pd.DataFrame
    patches: pd.DataFrame
    label: str
    #: collective ledger summaries (records only; a compat.csv has none)
    ledgers: dict[CellKey, Summary] = field(default_factory=dict)


@dataclass(kw_only=True)
class RunDiff:
    worse: list[str] = field(default_factory=list)
    better: list[str] = field(default_factory=list)
    fixed_upstream: list[str] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)
    patches_worse: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    #: collective ledger changes (``harness.results.ledger_changes``): shown, never "worse" by themselves
    ledger: list[str] = field(default_factory=list)
    old: str = ""
    new: str = ""

    @property
    def got_worse(self) -> bool:
        return bool(self.worse or self.patches_worse or self.gone)

    @property
    def verdict_changes(self) -> int:
        """Cells whose verdict or unexpected-flag changed either way, added or gone (two runs
        that should agree, as a run and its shuffled rerun: ``harness diff --strict``)."""
        return len(self.worse) + len(self.better) + len(self.fixed_upstream) + len(self.changed) + len(self.added) \
            + len(self.gone)

    def markdown(self) -> str:
        head = (f"**{len(self.worse) + len(self.patches_worse) + len(self.gone)} got worse**, "
                f"{len(self.better)} improved, {len(self.fixed_upstream)} newly fixed upstream, "
                f"{len(self.changed)} other verdict changes, {len(self.patches)} patch status changes, "
                f"{len(self.texts)} changed error texts, "
                f"{len(self.added)} cells added, {len(self.gone)} gone.")
        out = [f"## Changes: {self.old} → {self.new}", "", head, ""]
        for title, items in (("Got worse", self.worse), ("Patches newly broken or not provided", self.patches_worse),
                             ("Cells gone", self.gone), ("Newly fixed upstream", self.fixed_upstream),
                             ("Per-patch status changes", self.patches), ("Improved", self.better),
                             ("Other verdict changes", self.changed),
                             ("Changed error texts", self.texts), ("Cells added", self.added),
                             ("Collective changes", self.ledger)):
            if items:
                out += [f"### {title}", "", *(f"- {i}" for i in items), ""]
        if not any((self.worse, self.better, self.fixed_upstream, self.patches, self.changed, self.texts, self.added,
                    self.gone, self.ledger)):
            out.append("No change.")
        return "\n".join(out).rstrip() + "\n"


def load_side(path: str | Path) -> Side:
    """Records (files or folders) or a report's CSV."""
    p = Path(path)
    if p.suffix == ".csv":
        if not p.is_file():
            raise ValueError(f"no such file: {p}")
        cells, ledgers = read_report_csv(p), {}
        missing = [c for c in [*KEY, "verdict"] if c not in cells.columns]
        if missing:
            raise ValueError(f"{p}: not a compat.csv (no column {missing[0]!r})")
        patches_csv = p.with_name(p.stem + "-patches.csv")
        patches = read_report_csv(patches_csv) if patches_csv.is_file() else pd.DataFrame(
            columns=["patch", "device", "torch", "status"])
    else:
        tables = build_tables([p])
        cells, patches, ledgers = tables.cells, tables.patches, tables.ledgers
    return _side(cells, patches, ledgers, str(path))


def _side(cells: pd.DataFrame, patches: pd.DataFrame, ledgers: dict[CellKey, Summary], label: str) -> Side:
    cells = cells.assign(torch=[release_label(str(t)) for t in cells["torch"]], world_size=cells["world_size"].astype(int))
    statuses = [v for v in VARIANTS if v in cells.columns]
    cells = cells[cells[statuses].astype(str).ne("").any(axis=1)]  # cells that ran, not the grid's empty places
    patches = patches.assign(torch=[release_label(str(t)) for t in patches["torch"]])
    return Side(cells=cells, patches=patches, label=label, ledgers=ledgers)


@dataclass(kw_only=True)
class PrereleaseLane:
    """Per device, the newest stable torch of the records against each pre-release torch."""

    diffs: list[RunDiff] = field(default_factory=list)
    #: pre-releases with no stable release below them in the records
    alone: list[str] = field(default_factory=list)

    @property
    def got_worse(self) -> bool:
        return any(d.got_worse for d in self.diffs)

    def markdown(self) -> str:
        """Empty when the records hold no pre-release."""
        parts = [d.markdown() for d in self.diffs]
        parts += [f"## Pre-release {a}: no stable release below it in the records to compare with.\n" for a in self.alone]
        return "\n".join(["# Pre-release lane\n", *parts]) if parts else ""


def prerelease_lane(paths: list[str | Path]) -> PrereleaseLane:
    """What changes from the newest stable torch to each pre-release torch (2.16.0rc1, a .dev
    build) of the records, per device: the pre-release lane of ``matrix.yaml``."""
    tables = build_tables(paths)
    lane = PrereleaseLane()
    for device in tables.devices:
        versions = tables.versions(device)
        for candidate in [v for v in versions if is_prerelease(v)]:
            stable = [v for v in versions if not is_prerelease(v) and sorted_torch([v, candidate])[0] == v]
            if not stable:
                lane.alone.append(f"{candidate} ({device})")
                continue
            source = torch_source(tables.environment, device, candidate)
            old = _one_torch(tables, device, stable[-1], f"newest stable release on {device}")
            new = _one_torch(tables, device, candidate, f"pre-release on {device}{', from ' + source if source else ''}")
            lane.diffs.append(diff_runs(old, new))
    return lane


def _one_torch(tables: ReportTables, device: str, torch: str, label: str) -> Side:
    cells = tables.cells[(tables.cells["device"] == device) & (tables.cells["torch"] == torch)]
    patches = tables.patches[(tables.patches["device"] == device) & (tables.patches["torch"] == torch)]
    ledgers = {k: v for k, v in tables.ledgers.items() if k[0] == device and Version(k[3]) == Version(torch)}
    return _side(cells, patches, ledgers, label)


def _where(row) -> str:
    return f"{row['scenario']} w{row['world_size']} on {row['torch']} ({row['device']})"


def _statuses(row) -> str:
    return ", ".join(f"{v} {row[v]}" for v in VARIANTS if v in row and row[v])


def _exc(row) -> str:
    return next((row[f"{v}_exc"] for v in VARIANTS if f"{v}_exc" in row and row[f"{v}_exc"]), "")


def diff_runs(old: Side, new: Side) -> RunDiff:
    """Cell by cell (device, scenario, world size, torch). When each side holds one torch
    release and they differ (an upgrade), cells are matched across the two releases."""
    versions = (sorted(set(old.cells["torch"])), sorted(set(new.cells["torch"])))
    if len(versions[0]) == 1 and len(versions[1]) == 1 and versions[0] != versions[1]:
        old, new = _as_upgrade(old, versions[0][0], versions[1][0]), _as_upgrade(new, versions[0][0], versions[1][0])
    d = RunDiff(old=old.label, new=new.label)
    a = old.cells.set_index(KEY)
    b = new.cells.set_index(KEY)
    for key in a.index.difference(b.index):
        d.gone.append(f"{_where(dict(zip(KEY, key)) | dict(a.loc[key]))}: was {a.loc[key]['verdict']}")
    for key in b.index.difference(a.index):
        row = dict(zip(KEY, key)) | dict(b.loc[key])
        d.added.append(f"{_where(row)}: {row['verdict']} ({_statuses(row)})")
    for key in a.index.intersection(b.index):
        was, now = dict(zip(KEY, key)) | dict(a.loc[key]), dict(zip(KEY, key)) | dict(b.loc[key])
        line = f"{_where(now)}: {was['verdict']} → {now['verdict']} ({_statuses(now)})"
        flagged_now = bool(now.get("unexpected")) and not was.get("unexpected")
        if (now["verdict"] in BAD and was["verdict"] not in BAD) or flagged_now:
            d.worse.append(line + (f": {now.get('unexpected') or _exc(now)}" if flagged_now or _exc(now) else ""))
        elif now["verdict"] == FIXED_UPSTREAM and was["verdict"] != FIXED_UPSTREAM:
            d.fixed_upstream.append(line)
        elif (was["verdict"] in BAD and now["verdict"] not in BAD) or (was.get("unexpected") and not now.get("unexpected")):
            d.better.append(line)
        elif was["verdict"] != now["verdict"]:
            d.changed.append(line)
        elif _exc(was) and _exc(now) and not same_error(_exc(was), _exc(now)):
            d.texts.append(f"{_where(now)}: {_exc(was)!r} → {_exc(now)!r}")
    _patches(old, new, d)
    d.ledger = run_changes(old.ledgers, new.ledgers)
    return d


def _as_upgrade(side: Side, old: str, new: str) -> Side:
    label = f"torch {old} → {new}"
    return Side(cells=side.cells.assign(torch=label), patches=side.patches.assign(torch=label),
                label=f"{side.label} (torch {side.cells['torch'].iloc[0]})", ledgers=side.ledgers)


def _patches(old: Side, new: Side, d: RunDiff) -> None:
    pkey = ["patch", "device", "torch"]
    if old.patches.empty or new.patches.empty:
        return
    a, b = old.patches.set_index(pkey)["status"], new.patches.set_index(pkey)["status"]
    changed = []
    for key in a.index.intersection(b.index):
        if a[key] != b[key]:
            changed.append((key, a[key], b[key]))
    for (patch, device, torch), was, now in sorted(changed, key=lambda c: (c[0][0], c[0][1], sorted_torch([c[0][2]]))):
        line = f"{patch} on {torch} ({device}): {was} → {now}"
        (d.patches_worse if now in BAD_PATCH and was not in BAD_PATCH else d.patches).append(line)


# --------------------------------------------------------------------------- error texts

_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:[\w.~+@-]*/)+(?=[\w.+@-])"), ""),  # folders: a path reads as its file name
    (re.compile(r"\btmp[\w-]{4,}"), "tmp*"),  # temporary names
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x*"),  # pointers
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "*.*.*.*"),  # IPv4 addresses
    (re.compile(r"(?<=[\w\]]):\d+\b"), ":*"),  # host:port, file:line
    (re.compile(r"\b(pid|process|thread|tid)([ =:#]*)\d+", re.I), r"\1\2*"),
    (re.compile(r"\b(ranks?|rank\(s\))(\s*\[?)\d+(?:\s*,\s*\d+)*", re.I), r"\1\2*"),
    (re.compile(r"\[rank\d+\]", re.I), "[rank*]"),
    (re.compile(r"\bwhat\(\):\s+"), ""),  # C++ std::terminate's prefix, on the line taken or not
)
_SET = re.compile(r"\{([^{}]*,[^{}]*)\}")
#: where one rank's clause starts: "... (rank * lost its peers ...; rank * waited in ...)"
_CLAUSE = re.compile(r"; (?=rank\b)|(?<=\()(?=rank \*)")
CUT = "…"


def normalise_error(text: str) -> str:
    """The text with what differs between runs of the same error masked, and set literals sorted."""
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return _SET.sub(lambda m: "{" + ", ".join(sorted(i.strip() for i in m.group(1).split(","))) + "}", text)


def _pieces(text: str) -> tuple[list[str], bool]:
    """Clauses (the part before the first rank's, one per rank, a closing parenthesis apart)
    and whether the text was cut at its length limit."""
    norm = normalise_error(text)
    cut = norm.endswith(CUT)
    pieces = []
    for piece in _CLAUSE.split(norm.removesuffix(CUT)):
        if piece.startswith("rank") and piece.endswith(")") and piece.count(")") > piece.count("("):
            pieces += [piece[:-1], ")"]
        else:
            pieces.append(piece)
    return pieces, cut


def same_error(a: str, b: str) -> bool:
    """Whether two error texts tell the same error (see ``normalise_error``)."""
    if a == b or normalise_error(a) == normalise_error(b):
        return True
    (pa, cut_a), (pb, cut_b) = _pieces(a), _pieces(b)
    if cut_a or cut_b:  # a closing parenthesis may be past the cut
        pa, pb = [p for p in pa if p != ")"], [p for p in pb if p != ")"]
    common = Counter(pa) & Counter(pb)
    rest_a, rest_b = list((Counter(pa) - common).elements()), list((Counter(pb) - common).elements())
    if len(rest_a) != len(rest_b) or len(rest_a) > 2 or (rest_a and not (cut_a or cut_b)):
        return False

    def fits(x: str, y: str) -> bool:  # a cut last clause is the start of its counterpart
        return (cut_a and x == pa[-1] and y.startswith(x)) or (cut_b and y == pb[-1] and x.startswith(y))

    return any(all(fits(x, y) for x, y in zip(rest_a, order)) for order in itertools.permutations(rest_b))
