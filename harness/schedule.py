"""How cells share launches, and in which order and on which ranks they run.

One launch per device (``per="device"``, the default): torchrun starts the largest world
size once, and a cell of a smaller world size runs on a slot of its ranks, slots side by
side (a 4-rank launch runs two 2-rank cells or four 1-rank cells at once). The launch
runs in *stages*, one world size at a time; each slot works through its own queue and
all ranks meet at the end of a stage.

Order: cells certain to end the launch (a documented crash: the process aborts) come
last, each in a stage of its own, so a relaunch after one has little left to do. Within
a stage, cells are spread over the slots by their expected cost (a documented hang
costs its timeout), longest first, then each slot keeps vanilla first and the cells of
one patch set together (switching sets costs a snapshot restore and a re-import).

``per="world-size"`` gives the older plan, one launch per device and world size (the
benchmark compares both); ``isolate="process"`` gives each patch set launches of its own.
"""

from __future__ import annotations

from harness.plan import Cell, Stage

__all__ = ["group_into_launches", "stages"]


def group_into_launches(cells: list[Cell], *, per: str = "device", isolate: str = "snapshot") -> list[list[Cell]]:
    """Cells that can share one torchrun launch, in first-appearance order."""
    assert per in ("device", "world-size") and isolate in ("snapshot", "process"), (per, isolate)
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        key: tuple = (c.device,) if per == "device" else (c.device, c.world_size)
        if isolate == "process":
            key += (c.variant, c.patches)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def stages(cells: list[Cell], world: int) -> list[Stage]:
    """The stages of a launch of ``world`` ranks over ``cells`` (indices into the plan)."""
    order: dict[tuple, int] = {}
    for c in cells:
        order.setdefault((c.variant != "vanilla", c.patches), len(order))
    normal = [c for c in cells if c.risk < 3]
    out = []
    for ws in sorted({c.world_size for c in normal}, reverse=True):
        assert world % ws == 0, f"world size {ws} does not divide the launch's {world}"
        mine = [c for c in normal if c.world_size == ws]
        slots: list[list[Cell]] = [[] for _ in range(min(world // ws, len(mine)))]
        load = [0.0] * len(slots)
        for c in sorted(mine, key=_cost, reverse=True):
            i = load.index(min(load))
            slots[i].append(c)
            load[i] += _cost(c)
        out.append(Stage(world_size=ws, slots=[
            [c.index for c in sorted(s, key=lambda c: (c.risk, order[(c.variant != "vanilla", c.patches)], c.index))]
            for s in slots]))
    for c in sorted((c for c in cells if c.risk >= 3), key=lambda c: c.index):
        out.append(Stage(world_size=c.world_size, slots=[[c.index]]))
    return out


def _cost(c: Cell) -> float:
    """Expected seconds: a documented hang waits out its timeout; other cells are short."""
    return c.timeout_s if "hang" in c.expected else 0.1 * c.world_size
