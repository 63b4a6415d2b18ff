"""How the report names and colours things: its title and files, the verdicts' short labels
and colours, the patch statuses' colours, the legend, and the ids its links use."""

from __future__ import annotations

from collections.abc import Mapping

from harness.results.safe import safe_id

__all__ = ["ADJUSTED", "BLIND_SPOTS", "FLAG", "LEGEND", "OUTPUT_NAMES", "PATCH_COLORS", "SHORT", "TITLE",
           "VERDICT_COLORS", "anchor", "css"]

TITLE = "FSDP2 patch compatibility report"
OUTPUT_NAMES: Mapping[str, str] = {"md": "compat.md", "html": "compat.html", "csv": "compat.csv",
                                   "patches_csv": "compat-patches.csv", "stacks_csv": "compat-stacks.csv"}
FLAG, ADJUSTED = "⚠", "†"
#: verdict -> (heatmap label, colour)
SHORT: Mapping[str, tuple[str, str]] = {
    "patch broken": ("BROKEN", "#e57373"), "deployed set broken": ("DEPLOYED", "#f06292"),
    "not provided": ("n/p", "#b0bec5"), "regression": ("REGR", "#ce93d8"), "upstream bug": ("bug↑", "#9575cd"),
    "patch needed": ("need", "#ffb74d"), "use public API": ("api", "#4fc3f7"), "backport": ("back", "#ffe082"),
    "fixed upstream": ("fixed", "#81c784"), "expected failure": ("xfail", "#dcedc8"), "ok": ("ok", "#c8e6c9"),
    "n/a": ("n/a", "#e0e0e0"), "not run": ("–", "#fafafa"),
}
VERDICT_COLORS: Mapping[str, str] = {v: c for v, (_, c) in SHORT.items()}
PATCH_COLORS: Mapping[str, str] = {
    "broken": SHORT["patch broken"][1], "not provided": SHORT["not provided"][1],
    "needed": SHORT["patch needed"][1], "use public API": SHORT["use public API"][1],
    "backport": SHORT["backport"][1], "retire": SHORT["fixed upstream"][1], "not applicable": "#eeeeee",
    "not run": "#fafafa",
}
LEGEND = (f"Cell label: the verdict in short ({', '.join(f'{s} = {v}' for v, (s, _) in SHORT.items())}); "
          f"{FLAG} = a result differs from its documented expectation; {ADJUSTED} = judged against a reference "
          "adjusted for a known backend quirk (see Notes). Hover a cell for its records; click it for its details row.")


def css(prefix: str, name: str) -> str:
    return f"{prefix}-" + name.replace(" ", "-").replace("/", "")


def anchor(row: Mapping) -> str:
    return safe_id(f"d-{row['device']}-{row['scenario']}-w{row['world_size']}-{row['torch']}")


BLIND_SPOTS = "Blind spots: faults injected on the FSDP2 side (run --fault)"
