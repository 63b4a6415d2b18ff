"""How cells share launches, and in which order and on which ranks they run.

One launch per device (``per="device"``, the default): torchrun starts the largest world
size once (``slots`` times on CPU, ``launch_world``), and a cell of a smaller world size
runs on a slot of its ranks, slots side by side (a 4-rank launch runs two 2-rank cells or four
1-rank cells at once; with two slots, an 8-rank launch runs two 4-rank cells at once). The launch
runs in *stages*, one world size at a time; each slot works through its own queue and
all ranks meet at the end of a stage.

Isolation (``isolate``): with "snapshot", the default, cells share the worker; after each
cell every function, method and class of torch, its registries (global module hooks,
saved-tensor hooks, compiler configs) and its process-wide settings go back to what they
were before any cell (``harness.rank.leaks``, ``harness.rank.state``), and patch sets are
undone in turn (``harness.undertest.undo``); only cells that may end the process run forked.
With "fork" every CPU cell runs in a process forked from its rank's zygote
(``harness.rank.forked``), a copy of the worker taken before any scenario or patch code
ran: nothing a cell does can reach another, C++ state included, at the price of torch's
first-use work in every cell (measured on the 2.13 suite: 421 s of rank CPU against 325 s).
CUDA cannot be used across ``fork``: cuda cells always run in the worker.

Order: cells certain to end the launch come last, each in a stage of its own, so a
relaunch after one has little left to do. That is a documented crash (the process aborts)
on a device where cells cannot be forked: forked cells take their place in the slots like
the others, those that may end their process last in their slot. Within
a stage, cells are spread over the slots by their expected cost (a documented hang
costs its timeout), longest first, a scenario's cells on one slot where that keeps the
stage balanced; then each slot keeps vanilla first and the cells of one patch set
together (switching sets costs a snapshot restore and a re-import).

``per="world-size"`` gives the older plan, one launch per device and world size (the
benchmark compares both); ``isolate="process"`` gives each patch set launches of its own
(cells in the worker, as with "snapshot").

``shuffle=SEED`` (``run --shuffle``) checks that no cell's outcome depends on the cells
before it: the cells are spread over the slots in a seeded random order, and each slot
runs its cells in that order, patch sets interleaved. The same seed gives the same order.
Only what keeps a launch alive stays fixed: the stages (largest world size first) and, in
a slot, the cells that may end the process last.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from harness.plan.cells import Cell
from harness.vocabulary import ISOLATIONS

__all__ = ["CELLS_PER_SLOT", "Stage", "ends_launch", "group_into_launches", "launch_world", "runs_forked", "stages"]

#: the cells a CPU launch runs for each slot of its largest world size it starts (``harness run
#: --slots``): a slot's ranks cost their start, which a short launch does not win back (2 cores, two
#: slots against one: 13 cells a version, about 2 s slower over 9 versions; 137 cells even; 430 cells
#: 7–14% faster; docs/costs.md)
CELLS_PER_SLOT = 100


@dataclass(kw_only=True)
class Stage:
    """Cells of one world size; slot ``i`` runs on ranks ``[i * world_size, (i + 1) * world_size)``."""

    world_size: int
    slots: list[list[int]] = field(default_factory=list)

    def cells_of(self, slot: int) -> list[int]:
        return self.slots[slot] if slot < len(self.slots) else []


def group_into_launches(cells: list[Cell], *, per: str = "device", isolate: str = "snapshot") -> list[list[Cell]]:
    """Cells that can share one torchrun launch, in first-appearance order."""
    assert per in ("device", "world-size") and isolate in ISOLATIONS, (per, isolate)
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        key: tuple = (c.device,) if per == "device" else (c.device, c.world_size)
        if isolate == "process":
            key += (c.variant, c.patches)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def launch_world(cells: list[Cell], slots: int = 1) -> int:
    """The ranks of one launch over ``cells``: their largest world size, times ``slots`` on CPU,
    as far as the launch has ``CELLS_PER_SLOT`` cells for each."""
    largest = max(c.world_size for c in cells)
    if cells[0].device != "cpu":
        return largest
    return largest * max(1, min(slots, len(cells) // CELLS_PER_SLOT))


def stages(cells: list[Cell], world: int, *, shuffle: int | None = None, isolate: str = "snapshot") -> list[Stage]:
    """The stages of a launch of ``world`` ranks over ``cells`` (indices into the plan);
    ``shuffle``: the seed of a random order, ``isolate``: how cells are kept apart (see the
    module's docstring)."""
    position = {c.index: c.index for c in cells}
    if shuffle is not None:
        cells = random.Random(shuffle).sample(cells, len(cells))
        position = {c.index: i for i, c in enumerate(cells)}
    order: dict[tuple, int] = {}
    for c in cells:
        order.setdefault((c.variant != "vanilla", c.patches), len(order))

    def in_slot(c: Cell) -> tuple:
        if shuffle is not None:
            return (c.run_order, position[c.index])
        return (c.run_order, order[(c.variant != "vanilla", c.patches)], c.index)

    normal = [c for c in cells if not ends_launch(c, isolate)]
    home: dict[str, int] = {}  # scenario -> first rank of the slot that ran it last
    out = []
    for ws in sorted({c.world_size for c in normal}, reverse=True):
        assert world % ws == 0, f"world size {ws} does not divide the launch's {world}"
        mine = [c for c in normal if c.world_size == ws]
        slots = _assign(mine, min(world // ws, len(mine)), home, ws)
        out.append(Stage(world_size=ws, slots=[
            [c.index for c in sorted(s, key=in_slot)] for s in slots]))
    for c in sorted((c for c in cells if ends_launch(c, isolate)), key=lambda c: position[c.index]):
        out.append(Stage(world_size=c.world_size, slots=[[c.index]]))
    return out


def _assign(cells: list[Cell], n: int, home: dict[str, int], ws: int) -> list[list[Cell]]:
    """Spread ``cells`` over ``n`` slots, longest first, keeping a scenario's cells on one
    slot (and on the ranks that ran it in a larger stage) unless that unbalances the stage:
    a process pays once for what a scenario warms up (a compiled block, a model's first
    forward), not once per variant.

    Cells that may hang are balanced on their own, one by one, and the others on theirs:
    the stage stays short whether the hangs happen or not."""
    slots: list[list[Cell]] = [[] for _ in range(n)]
    hang_load, load = [0.0] * n, [0.0] * n
    for c in sorted((c for c in cells if _hangs(c)), key=_cost, reverse=True):
        i = min(range(n), key=lambda k: (hang_load[k], load[k]))
        slots[i].append(c)
        hang_load[i] += _cost(c)
        load[i] += 0.1 * c.world_size
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        if not _hangs(c):
            groups.setdefault(c.scenario, []).append(c)
    share = sum(_cost(c) for c in cells if not _hangs(c)) / n
    units: list[tuple[list[Cell], bool]] = []  # (cells, whether they are the scenario's whole group)
    for group in groups.values():
        split = len(group) > 1 and sum(map(_cost, group)) > share
        units += [([c], False) for c in group] if split else [(group, True)]
    for unit, whole in sorted(units, key=lambda u: sum(map(_cost, u[0])), reverse=True):
        cost = sum(map(_cost, unit))
        i = load.index(min(load))
        preferred = home.get(unit[0].scenario, -1) // ws
        if whole and 0 <= preferred < n and load[preferred] - load[i] <= cost:
            i = preferred
        slots[i] += unit
        load[i] += cost
        home[unit[0].scenario] = i * ws
    return slots


def ends_launch(c: Cell, isolate: str = "snapshot") -> bool:
    """A documented crash that runs in the worker itself (no fork on its device)."""
    return c.certain_crash and not runs_forked(c, isolate)


def runs_forked(c: Cell, isolate: str = "snapshot") -> bool:
    """Whether ``c`` runs in a process forked from the rank's zygote (``harness.rank.forked``):
    every CPU cell with ``isolate="fork"``, else the CPU cells that may end their process
    (an abort costs the cell, not the launch). CUDA cannot be used across ``fork``: cuda
    cells run in the worker itself."""
    return c.device == "cpu" and hasattr(os, "fork") and (isolate == "fork" or c.may_end_process)


def _hangs(c: Cell) -> bool:
    """Documented to hang, or to hang or fail otherwise (``error|hang``)."""
    return "hang" in c.expected


def _cost(c: Cell) -> float:
    """Expected seconds: a documented hang waits out its timeout; one that may also fail
    otherwise (``error|hang``) is counted as a second, as it usually fails fast; other
    cells are short."""
    if not _hangs(c):
        return 0.1 * c.world_size
    return c.timeout_s if tuple(c.expected) == ("hang",) else min(1.0, c.timeout_s)
