"""What release of torch a version string names, in one place (torch-free).

* ``release("2.13.0+cpu")`` -> ``Version("2.13.0")``: the build label dropped, a pre-release
  kept (``2.16.0rc1`` is not 2.16.0): what a record, a ledger or an install is of;
* ``base_release("2.16.0rc1")`` -> ``Version("2.16.0")``: what a scenario's expectations
  compare (a release candidate behaves as the release it leads to);
* ``release_label`` (a report's column head), ``is_prerelease`` and ``sorted_torch``.
Unparsable strings ("nightly") are no release: ``release`` gives ``Version("0")``, they sort last.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

__all__ = ["base_release", "is_prerelease", "release", "release_label", "sorted_torch", "torch_sort_key"]


def release(version: str) -> Version:
    """``2.13.0+cpu`` -> 2.13.0; ``2.16.0rc1+cu128`` -> 2.16.0rc1; unparsable -> 0."""
    try:
        return Version(Version(version).public)
    except InvalidVersion:
        return Version("0")


def base_release(version: str) -> Version:
    """``2.13.0+cpu`` -> 2.13.0; ``2.16.0rc1`` -> 2.16.0 (pre-release and local labels dropped)."""
    return Version(Version(version).base_version)


def release_label(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (a column head: the string up to the build label)."""
    return version.split("+", 1)[0]


def is_prerelease(version: str) -> bool:
    """``2.16.0rc1``, ``2.16.0.dev20260301``: a torch that is not a release yet."""
    try:
        return Version(version).is_prerelease
    except InvalidVersion:
        return False


def torch_sort_key(version: str) -> tuple[int, Any, str]:
    """Numeric version order; unparsable strings go last, alphabetically."""
    try:
        return (0, Version(version), version)
    except InvalidVersion:
        return (1, 0, version)


def sorted_torch(versions: Iterable[str]) -> list[str]:
    return sorted(set(versions), key=torch_sort_key)
