"""The harness's own savings per cell, each of which the benchmark can turn off to measure it.

``FSDP_COMPAT_CUTS_OFF=group_reuse,probe_cache`` (read once per process, passed through
torchrun to every rank) turns the named cuts off; nothing else reads it, and every cut is
on by default. ``bench/launch_bench.py --each-cut`` runs the suite once per cut turned off,
side by side with all on and all off, so each cut's gain is measured, not assumed.
"""

from __future__ import annotations

import os

__all__ = ["CUTS", "ENV", "enabled", "off", "parse_off"]

ENV = "FSDP_COMPAT_CUTS_OFF"

#: name -> what it saves
CUTS: dict[str, str] = {
    "memory_stamps": "watchdog phase stamps written into a memory-mapped page, no file opened per stamp",
    "group_reuse": "the default process group kept between a slot's consecutive healthy cells",
    "probe_cache": "the gloo AVG probe measured once per (patch set, slot, shard group, reduce dtype), kept after healthy cells",
    "selective_preload": "a rank preloads only what its own cells need",
    "pin_ranks": "each rank pinned to one core where a launch has more ranks than the machine has cores",
    "gc_freeze": "what a rank imported before its first cell moved out of the garbage collector's view (gc.freeze)",
}


def parse_off(value: str) -> frozenset[str]:
    """The cuts named in ``value`` (comma-separated; "all" names every cut); ``ValueError``
    naming an unknown one."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    if "all" in names:
        return frozenset(CUTS)
    unknown = sorted(names - set(CUTS))
    if unknown:
        raise ValueError(f"{ENV}: unknown cut(s) {', '.join(unknown)}; known: {', '.join(CUTS)}, all")
    return frozenset(names)


_off: frozenset[str] | None = None


def off() -> frozenset[str]:
    """The cuts this process runs without (``ValueError`` for a bad ``FSDP_COMPAT_CUTS_OFF``:
    the launcher checks it before any launch starts)."""
    global _off
    if _off is None:
        _off = parse_off(os.environ.get(ENV, ""))
    return _off


def enabled(name: str) -> bool:
    assert name in CUTS, name
    return name not in off()
