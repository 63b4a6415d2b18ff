"""The table a maintainer acts on: per patch, the torch versions where it is needed, can
be replaced by a public API, backports a feature, can be retired, is broken or is not
provided, as version ranges, with the evidence and the caveats; and which torch columns
are a pre-release (the matrix's pre-release lane: a candidate, not a release) or came from
a source of their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from harness.versions import is_prerelease
from harness.vocabulary import PS_API, PS_BACKPORT, PS_BROKEN, PS_NEEDED, PS_NOT_PROVIDED, PS_RETIRE

__all__ = ["LIFECYCLE_COLUMNS", "deployed_line", "lane_notes", "lifecycle", "torch_columns",
           "torch_source", "version_ranges"]

_UNJUDGED = "no verdict (why)"

#: status -> column head of the lifecycle table, in the order a maintainer reads them
LIFECYCLE_COLUMNS: dict[str, str] = {
    PS_NEEDED: "needed (keep)",
    PS_API: "replace with public API",
    PS_BACKPORT: "backport (vanilla lacks the feature)",
    PS_RETIRE: "retire (fixed upstream)",
    PS_BROKEN: "broken",
    PS_NOT_PROVIDED: "not provided",
}
_SCENARIO = re.compile(r"(?:^|; )([\w]+) w\d+:")


def version_ranges(versions: Sequence[str], chosen: set[str]) -> str:
    """Runs of consecutive ``versions`` that are in ``chosen``: "2.7.1–2.12.1, 2.15.0"."""
    runs: list[list[str]] = []
    previous_in = False
    for v in versions:
        if v in chosen:
            if previous_in:
                runs[-1].append(v)
            else:
                runs.append([v])
        previous_in = v in chosen
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def lifecycle(patches: pd.DataFrame, device: str, versions: Sequence[str]) -> pd.DataFrame:
    """One row per patch: for each status, the version ranges that have it (and the why)."""
    mine = patches[patches["device"] == device]
    rows = []
    for patch, g in mine.groupby("patch", sort=True):
        row: dict[str, str] = {"patch": str(patch)}
        for status, head in LIFECYCLE_COLUMNS.items():
            have = g[g["status"] == status]
            text = version_ranges(versions, set(have["torch"]))
            if text and status == PS_API:
                text += ": " + ", ".join(sorted({a for a in have["api"] if a}))
            if text and status == PS_RETIRE:
                shown = sorted({m for d in have["detail"] for m in _SCENARIO.findall(d)})
                more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
                text += f" (shown by {', '.join(shown[:4])}{more})" if shown else ""
            row[head] = text
        open_ = g[g["status"].isin(["not applicable", "not run"])]
        whys = sorted({w for ws in open_["why"] for w in ws.split("; ") if w})
        row[_UNJUDGED] = version_ranges(versions, set(open_["torch"])) + (f" ({'; '.join(whys)})" if whys else "")
        caveats: dict[str, set[str]] = {}
        for torch, text in zip(g["torch"], g["caveats"]):
            for c in filter(None, text.split("; ")):
                caveats.setdefault(c, set()).add(torch)
        row["caveats"] = "; ".join(f"{c} ({version_ranges(versions, vs)})" for c, vs in sorted(caveats.items()))
        rows.append(row)
    return pd.DataFrame(rows, columns=["patch", *LIFECYCLE_COLUMNS.values(), _UNJUDGED, "caveats"])


def deployed_line(deployed: pd.DataFrame, device: str, versions: Sequence[str]) -> str:
    """One sentence on the set users ship, for one device."""
    mine = deployed[deployed["device"] == device].set_index("torch")
    ran = [v for v in versions if v in mine.index and mine.at[v, "cells"]]
    if not ran:
        return "The deployed set (every patch installed together) was not run."
    bad = [v for v in ran if mine.at[v, "not as documented"]]
    total = int(mine.loc[ran, "cells"].sum())
    if not bad:
        return (f"The deployed set (every patch installed together) ran {total} cells on "
                f"{version_ranges(versions, set(ran))}: every one as documented.")
    where = "; ".join(f"{v}: {mine.at[v, 'where']}" for v in bad)
    return (f"The deployed set (every patch installed together) ran {total} cells on "
            f"{version_ranges(versions, set(ran))}; not as documented on {where}.")


# --------------------------------------------------------------------------- the pre-release lane


def torch_columns(frame: pd.DataFrame, versions: Sequence[str]) -> pd.DataFrame:
    """``frame``'s torch columns in ``versions`` order, a pre-release's head marked "(pre-release)"."""
    return frame.reindex(columns=list(versions)).rename(
        columns={v: f"{v} (pre-release)" for v in versions if is_prerelease(v)})


def torch_source(environment: pd.DataFrame, device: str, version: str) -> str:
    """Where that torch came from, as the matrix's source entry named it ("" for none)."""
    mine = environment[(environment["device"] == device) & (environment["torch"] == version)]
    return str(mine["torch source"].iloc[0]) if len(mine) and "torch source" in mine else ""


def lane_notes(environment: pd.DataFrame, device: str, versions: Sequence[str]) -> list[str]:
    """One line per torch of ``device`` that is a pre-release or came from a source of its own."""
    notes = []
    for v in versions:
        source = torch_source(environment, device, v)
        if is_prerelease(v) or source:
            what = "a pre-release: its columns judge a candidate, not a release" if is_prerelease(v) \
                else "a release from a source of its own"
            notes.append(f"Torch {v} is {what}" + (f" (from {source})." if source else "."))
    return notes
