"""Expected outcomes: what a scenario documents a cell to do, per torch range, variant,
device and world size (``Expect``), and the default when nothing matches (``PASS``)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.vocabulary import DEVICES, VARIANTS, Device, Status, Variant, parse_statuses

__all__ = ["PASS", "Expect", "torch_release"]


@dataclass(kw_only=True, frozen=True)
class Expect:
    """An expected outcome for cells matching ``torch``/``variants``/``devices``/``world_sizes``.

    ``status`` may name alternatives with ``|`` ("hang|crash|error"); it is kept as a
    tuple. ``match`` is text the first error line (or the traceback) must contain.
    ``fixed_by`` names the patch that fixes this documented failure (the verdicts credit
    that patch alone); ``upstream`` names the upstream issue of a failure no patch fixes.
    """

    status: tuple[Status, ...] | str
    torch: str = ""
    variants: tuple[Variant, ...] = ("vanilla",)
    match: str | None = None
    devices: tuple[Device, ...] = DEVICES
    world_sizes: tuple[int, ...] | None = None
    why: str = ""
    fixed_by: str | None = None
    upstream: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", parse_statuses(self.status))
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


#: What a cell is expected to do when no ``Expect`` matches it.
PASS = Expect(status="pass", variants=VARIANTS)


def torch_release(version: str) -> Version:
    """``2.13.0+cpu`` -> ``Version('2.13.0')`` (local labels and pre-release tags dropped)."""
    return Version(Version(version).base_version)
