"""Cells: what to run.

A cell is (scenario, variant, device, backend, world size). It carries everything its
record needs, the expectation included, so the worker and the launcher write records
from the cell alone (``harness.plan.placement`` groups cells into launches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.vocabulary import DEVICES, FAULT_NAMES, VARIANTS

if TYPE_CHECKING:  # not imported: a run whose plan was saved reads its cells without torch (harness.plan.saved)
    from harness.scenario.spec import Scenario

#: per-cell timeout when neither the scenario nor the run sets one
DEFAULT_TIMEOUT_S = 30.0
#: the patch every cell of a meta-init run installs: a sharded random init drawn as one process draws it (bug N)
META_WORKAROUND = "meta_init_full_rng"

__all__ = ["DEFAULT_TIMEOUT_S", "META_WORKAROUND", "Cell", "all_patch_names", "plan_cells"]


@dataclass(kw_only=True)
class Cell:
    index: int
    scenario: str
    variant: str
    device: str
    backend: str
    world_size: int
    mesh: tuple[int, ...]
    timeout_s: float
    #: the patches this cell installs
    patches: tuple[str, ...] = ()
    #: the patches its scenario names (what the verdicts credit)
    scenario_patches: tuple[str, ...] = ()
    #: whether the scenario's bug can show on this device at all
    bug_observable: bool = True
    expected: tuple[str, ...] = ("pass",)
    expected_match: str | dict[str, str] | None = None
    why: str = ""
    #: the patch that fixes the documented failure, and the upstream issue of one no patch fixes
    fixed_by: str | None = None
    upstream: str | None = None
    #: the scenario's public API alternative ("name (torch >= X)") and the patches it replaces
    api: str | None = None
    api_replaces: tuple[str, ...] = ()
    #: "meta": built on the meta device (``run --init meta``, ``harness.train.meta_build``)
    init: str = "full"
    #: a fault injected on the FSDP2 side (``run --fault``, ``harness.train.faults``): the cell must
    #: turn into a mismatch that names every parameter the fault changed
    fault: str | None = None
    #: the cell's inputs, hashed (``harness.plan.inputs``); set by the planning step
    inputs: str = ""
    #: those its reference depends on (``CellInputs.reference_inputs``): the module under test and the options left out
    reference_inputs: str = ""

    @property
    def label(self) -> str:
        return f"{self.scenario}[{self.variant},{self.device},w{self.world_size}]"

    @property
    def expects_error(self) -> bool:
        """Documented to raise inside the cell (it may leave its process group broken)."""
        return "error" in self.expected

    @property
    def may_end_process(self) -> bool:
        """Documented to hang or crash: it may take the process that runs it down."""
        return bool({"hang", "crash"} & set(self.expected))

    @property
    def certain_crash(self) -> bool:
        """Documented to crash (the process aborts), and nothing else."""
        return set(self.expected) == {"crash"}

    @property
    def run_order(self) -> tuple[bool, bool, bool]:
        """Within a slot: cells that finish cleanly first, then errors, then those that may end the process."""
        return (self.certain_crash, self.may_end_process, self.expects_error)

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        tuples = ("mesh", "patches", "scenario_patches", "expected", "api_replaces")
        return cls(**{k: tuple(v) if k in tuples else v for k, v in data.items()})


def plan_cells(
    scenarios: list[Scenario],
    *,
    world_sizes: list[int] | None,
    devices: list[str],
    variants: list[str],
    explicit_scenarios: bool,
    timeout_s: float | None = None,
    deployed_patches: tuple[str, ...] = (),
    torch_version: str | None = None,
    init: str = "full",
    fault: str | None = None,
) -> list[Cell]:
    """Every supported (scenario, variant, device, world size) combination, in order.

    ``vanilla`` installs nothing; ``patched`` the scenario's own patches (only scenarios
    that name some); ``deployed`` every patch of the module (``deployed_patches``), as
    users ship them, which also shows whether the patches leave ordinary training alone;
    ``api`` installs nothing and turns on the scenario's public API (only scenarios that
    declare one).

    A world size or device asked for by name for a scenario asked for by name that the
    scenario does not support is a ``ValueError``; without named scenarios such
    combinations are left out.

    ``init="meta"`` builds every model on the meta device; every variant also installs
    ``META_WORKAROUND`` (bug N's fix), without which no scenario's own verdict shows: on CPU
    every rank's shard repeats one random stream; on CUDA DTensor's offset-based tracker draws
    other values than one process does, at world size 1 too (H200, torch 2.11: every vanilla
    cell of ``--init meta`` a mismatch at its step-0 params, max |diff| 0.53 in ``plain``).

    ``fault`` (``harness.train.faults``) plans only the cells documented to pass, each expected
    to become a mismatch that names what the fault changed.
    """
    for d in devices:
        if d not in DEVICES:
            raise ValueError(f"unknown device {d!r} (choose from {', '.join(DEVICES)})")
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r} (choose from {', '.join(VARIANTS)})")
    for ws in world_sizes or []:
        if ws < 1:
            raise ValueError(f"world size must be a positive integer, got {ws}")
    if init not in ("full", "meta"):
        raise ValueError(f"unknown init {init!r} (choose from full, meta)")
    if fault is not None and fault not in FAULT_NAMES:
        raise ValueError(f"unknown fault {fault!r} (choose from {', '.join(FAULT_NAMES)})")
    version = torch_version or _torch_version()
    cells: list[Cell] = []
    for s in scenarios:
        for ws in _sizes(s, world_sizes, explicit_scenarios):
            for d in devices:
                if d not in s.devices:
                    if explicit_scenarios:
                        raise ValueError(f"scenario {s.name!r} does not support device {d!r}")
                    continue
                for v in variants:
                    if (v == "patched" and not s.patches) or (v == "api" and s.api is None):
                        continue
                    expect = s.expected(variant=v, torch_version=version, device=d, world_size=ws)
                    if fault is not None and expect.status != ("pass",):
                        continue
                    installs = {"patched": tuple(s.patches), "deployed": deployed_patches,
                                # the API replaces its patches; the scenario's others stay
                                "api": tuple(p for p in s.patches if s.api and p not in s.api.replaces)}.get(v, ())
                    meta = init == "meta" and s.sharding.init == "full"
                    if meta and META_WORKAROUND not in installs:
                        installs = (*installs, META_WORKAROUND)
                    cells.append(Cell(
                        index=len(cells), scenario=s.name, variant=v, device=d, backend=s.backend_for(d),
                        world_size=ws, mesh=s.sharding.mesh_shape(ws),
                        timeout_s=s.timeout_s or timeout_s or DEFAULT_TIMEOUT_S, patches=installs,
                        scenario_patches=tuple(s.patches), bug_observable=d in s.bug_devices,
                        expected=expect.status, expected_match=expect.match, why=expect.why,  # type: ignore[arg-type]
                        fixed_by=expect.fixed_by, upstream=expect.upstream,
                        api=s.api.describe() if s.api else None, api_replaces=s.api.replaces if s.api else (),
                        init="meta" if meta or s.sharding.init == "meta" else "full", fault=fault,
                    ))
                    if fault is not None:
                        cells[-1].expected, cells[-1].why = ("mismatch",), f"fault injected: {fault}"
    return cells


def _sizes(s: Scenario, world_sizes: list[int] | None, explicit: bool) -> list[int]:
    sizes = []
    for ws in world_sizes or s.world_sizes:
        if ws in s.world_sizes:
            sizes.append(ws)
        elif explicit and world_sizes:
            supported = ", ".join(str(w) for w in s.world_sizes)
            raise ValueError(f"scenario {s.name!r} does not support world size {ws} (supports {supported})")
    return sizes


def all_patch_names(scenarios: list[Scenario]) -> tuple[str, ...]:
    """Every patch any scenario names, in first-mention order (install order matters)."""
    names: dict[str, None] = {}
    for s in scenarios:
        names.update(dict.fromkeys(s.patches))
    return tuple(names)


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")
