"""The project's vocabulary, in one torch-free place: statuses, variants, devices,
verdicts and patch statuses, the failure kinds the harness records, the defaults a run
starts from, and the ``"a|b"`` status syntax.

Every other module imports these names from here; nothing else defines them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Literal, get_args

__all__ = [
    "Failure",
    "Outcome",
    "DEFAULT_MODULE",
    "DEFAULT_WORLD_SIZES",
    "DEVICES",
    "Device",
    "Status",
    "Variant",
    "BACKPORT",
    "DEPLOYED_BROKEN",
    "EXPECTED_FAILURE",
    "FIXED_UPSTREAM",
    "NOT_APPLICABLE",
    "NOT_PROVIDED",
    "NOT_RUN",
    "OK",
    "PATCH_BROKEN",
    "PATCH_NEEDED",
    "PATCH_STATUSES",
    "PS_API",
    "PS_BACKPORT",
    "PS_BROKEN",
    "PS_NEEDED",
    "PS_NOT_APPLICABLE",
    "PS_NOT_PROVIDED",
    "PS_NOT_RUN",
    "PS_RETIRE",
    "REGRESSION",
    "UPSTREAM_BUG",
    "USE_API",
    "VERDICTS",
    "FAILING",
    "INSTALL_STATUSES",
    "FAULT_NAMES",
    "ISOLATIONS",
    "STATUSES",
    "VARIANTS",
    "INSTALLING",
    "format_statuses",
    "installs_patches",
    "match_for",
    "parse_statuses",
]

#: Every status a cell can end with.
Status = Literal["pass", "mismatch", "error", "hang", "crash", "skip"]
STATUSES: tuple[str, ...] = get_args(Status)
#: The statuses that mean the cell went wrong.
FAILING: frozenset[str] = frozenset({"mismatch", "error", "hang", "crash"})
#: How a cell treats the patches module: stock torch; the scenario's own patches; every
#: patch of the module, as users ship it; stock torch with the public API that replaces
#: the scenario's patch turned on.
Variant = Literal["vanilla", "patched", "deployed", "api"]
VARIANTS: tuple[str, ...] = get_args(Variant)
#: the variants whose cells install patches (``--init meta``: every variant installs the workaround)
INSTALLING: tuple[str, ...] = ("patched", "deployed")
Device = Literal["cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)
#: the patches module under test unless a run names another (the project's own)
DEFAULT_MODULE = "fsdp_patches"
#: the world sizes a scenario runs at unless it says otherwise (``Scenario.world_sizes``)
DEFAULT_WORLD_SIZES: tuple[int, ...] = (1, 2, 4)
#: The faults ``run --fault`` injects on the FSDP2 side (``harness.train.faults``).
FAULT_NAMES: tuple[str, ...] = ("grad_rel", "sign_flip", "drop_micro_batch", "double_rank")
#: How cells are kept apart (``harness.plan.placement``), the default first.
ISOLATIONS: tuple[str, ...] = ("snapshot", "fork", "process")
#: What a patch's install function may report.
INSTALL_STATUSES: tuple[str, ...] = ("installed", "already-installed", "not-applicable", "not-provided", "error")

# Cell verdicts, most severe first (the order of legends and counts).
PATCH_BROKEN = "patch broken"
DEPLOYED_BROKEN = "deployed set broken"
NOT_PROVIDED = "not provided"
REGRESSION = "regression"
UPSTREAM_BUG = "upstream bug"
PATCH_NEEDED = "patch needed"
USE_API = "use public API"
BACKPORT = "backport"
FIXED_UPSTREAM = "fixed upstream"
EXPECTED_FAILURE = "expected failure"
OK = "ok"
NOT_APPLICABLE = "n/a"
NOT_RUN = "not run"
VERDICTS: tuple[str, ...] = (
    PATCH_BROKEN, DEPLOYED_BROKEN, NOT_PROVIDED, REGRESSION, UPSTREAM_BUG, PATCH_NEEDED, USE_API, BACKPORT,
    FIXED_UPSTREAM, EXPECTED_FAILURE, OK, NOT_APPLICABLE, NOT_RUN,
)

# Per-patch statuses, strongest first: what a maintainer does with the patch on that torch.
PS_BROKEN = "broken"
PS_NOT_PROVIDED = "not provided"
PS_NEEDED = "needed"
PS_API = "use public API"
PS_BACKPORT = "backport"
PS_RETIRE = "retire"
PS_NOT_APPLICABLE = "not applicable"
PS_NOT_RUN = "not run"
PATCH_STATUSES: tuple[str, ...] = (
    PS_BROKEN, PS_NOT_PROVIDED, PS_NEEDED, PS_API, PS_BACKPORT, PS_RETIRE, PS_NOT_APPLICABLE, PS_NOT_RUN,
)


class Failure(StrEnum):
    """The kinds of failure the harness itself writes to a record's ``exc_type`` (beside the
    names of exceptions the code under test raised), one spelling each."""

    #: no result within the cell's timeout (``harness.rank.watchdog.CellTimeout``)
    CELL_TIMEOUT = "CellTimeout"
    #: a rank's process died of a signal
    SIGNAL = "Signal"
    #: a rank's process exited (``os._exit`` in the code under test)
    EXIT_CODE = "ExitCode"
    #: a launch ended without a result and without a rank to blame
    LAUNCH_ERROR = "LaunchError"
    #: the harness could not judge the cell (its reference process failed, no snapshots)
    HARNESS_ERROR = "HarnessError"
    #: the scenario itself is wrong (its reference is not finite)
    SCENARIO_ERROR = "ScenarioError"
    #: a scenario file failed to load
    SCENARIO_LOAD_ERROR = "ScenarioLoadError"
    #: a patch of the cell's set failed to install
    PATCH_INSTALL_ERROR = "PatchInstallError"


class Outcome(StrEnum):
    """What one record of a report cell says, as the verdict table reads it
    (``harness.results.verdict.outcome`` and ``VERDICT_RULES``)."""

    #: passed
    PASS = "pass"
    #: failed as documented
    XFAIL = "xfail"
    #: failed as documented, with an upstream issue to point at
    UPSTREAM = "upstream"
    #: failed where it should not have
    FAIL = "fail"
    SKIP = "skip"
    #: a patch of its set failed to install
    BROKEN = "broken"
    #: the module under test has no function for a patch of the scenario
    NOT_PROVIDED = "not-provided"
    #: no record
    MISSING = "missing"


def parse_statuses(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"hang|crash"`` -> ``("hang", "crash")``; ``ValueError`` naming an unknown status."""
    items = tuple(text.split("|")) if isinstance(text, str) else tuple(text)
    if not items:
        raise ValueError("an expected status is required")
    for s in items:
        if s not in STATUSES:
            raise ValueError(f"unknown status {s!r} (choose from {', '.join(STATUSES)})")
    return items


def format_statuses(statuses: tuple[str, ...] | list[str]) -> str:
    """The inverse of ``parse_statuses``: ``("hang", "crash")`` -> ``"hang|crash"``."""
    return "|".join(statuses)


def match_for(match: str | dict[str, str] | None, status: str) -> str | None:
    """The text a failure with ``status`` must contain: ``match`` is one text for every status,
    or a text per status (``{"error": "...", "hang": "..."}``)."""
    return match.get(status) if isinstance(match, dict) else match


def installs_patches(variants: Iterable[str], init: str) -> bool:
    """Whether a run of ``variants`` built with ``init`` may install patches in some cell."""
    return init == "meta" or any(v in INSTALLING for v in variants)
