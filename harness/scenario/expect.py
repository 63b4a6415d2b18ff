"""Expected outcomes: what a scenario documents a cell to do, per torch range, variant,
device and world size (``Expect``), and the default when nothing matches (``PASS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.versions import base_release
from harness.vocabulary import DEVICES, VARIANTS, Device, Status, Variant, match_for, parse_statuses

__all__ = ["GLOO_ABORT", "HANG", "PASS", "Expect", "torch_release"]


@dataclass(kw_only=True, frozen=True)
class Expect:
    """An expected outcome for cells matching ``torch``/``variants``/``devices``/``world_sizes``.

    ``status`` may name alternatives with ``|`` ("hang|crash|error"); it is kept as a
    tuple. ``match`` is text the failure's message, traceback or worst difference must
    contain: one text, or with several statuses one per status (``{"error": "...", "hang":
    "no result"}``), so an ImportError never passes for the documented bug. A documented
    mismatch names its symptom: a ``match`` for it, or a ``symptom`` checked on the numbers
    (``harness.scenario.symptoms``: grads scaled by the group's size, which parameters differ).
    ``fixed_by`` names the patch that fixes this documented failure (the verdicts credit
    that patch alone); ``upstream`` names the upstream issue of a failure no patch fixes.
    """

    status: tuple[Status, ...] | str
    torch: str = ""
    variants: tuple[Variant, ...] = ("vanilla",)
    match: str | dict[str, str] | None = None
    symptom: Callable[[Any], str | None] | None = None
    devices: tuple[Device, ...] = DEVICES
    world_sizes: tuple[int, ...] | None = None
    why: str = ""
    fixed_by: str | None = None
    upstream: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", parse_statuses(self.status))
        failing = [s for s in self.status if s not in ("pass", "skip")]
        if isinstance(self.match, dict) and not set(self.match) <= set(self.status):
            raise ValueError(f"Expect: match names a status it does not expect: {sorted(set(self.match) - set(self.status))}")
        if len(failing) > 1 and (not isinstance(self.match, dict) or set(self.match) != set(failing)):
            raise ValueError(f"Expect({'|'.join(self.status)}): give a match per status, e.g. "
                             f"match={{{', '.join(repr(s) + ': ...' for s in failing)}}}")
        if "mismatch" in self.status and not match_for(self.match, "mismatch") and self.symptom is None:
            raise ValueError("Expect(mismatch): name the symptom: a match for it, or symptom=... "
                             "(harness.scenario.symptoms)")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"Expect.variants: unknown variant {v!r} (choose from {', '.join(VARIANTS)})")
        try:
            SpecifierSet(self.torch)
        except InvalidSpecifier as e:
            raise ValueError(f"Expect.torch: bad version range {self.torch!r}") from e

    def applies(self, *, variant: str, torch_version: str, device: str, world_size: int) -> bool:
        """Whether this expectation covers the cell; one for "patched" covers "deployed" too
        (the deployed set is the scenario's patches plus every other one)."""
        return (
            (variant in self.variants or (variant == "deployed" and "patched" in self.variants))
            and device in self.devices
            and (self.world_sizes is None or world_size in self.world_sizes)
            and torch_release(torch_version) in SpecifierSet(self.torch)
        )


#: What every hang record says (``harness.rank.peers.blame``, the launcher's kill), and what a
#: crash of gloo on a collective size mismatch says: for ``Expect.match`` per status.
HANG = "no result"
GLOO_ABORT = "enforce fail"

#: What a cell is expected to do when no ``Expect`` matches it.
PASS = Expect(status="pass", variants=VARIANTS)


def torch_release(version: str) -> Version:
    """``2.13.0+cpu`` -> ``Version('2.13.0')`` (local labels and pre-release tags dropped:
    ``harness.versions.base_release``)."""
    return base_release(version)
