"""What a matrix installs besides torch, and where from: ``install`` entries, ``scenarios_dirs``
and torch versions with a source of their own (the pre-release lane), validated strictly
(``ValueError``, one line naming the field). Paths are taken from the matrix file's folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SOURCE_VERSION", "TorchSource", "in_range", "parse_install", "parse_scenarios_dirs", "parse_source"]

_SOURCE_KEYS = {"version", "index_url", "find_links", "pre"}
#: a version with its own source: X.Y.Z, optionally a pre-release (a1, b2, rc1) and/or .devN
SOURCE_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?$")
_URL = re.compile(r"^(?:https?|file)://\S+$")
_ARCHIVES = (".whl", ".tar.gz", ".zip")


def in_range(version: str, spec: str) -> bool:
    """Whether torch ``version`` is in the range ``spec`` (">=2.6"); a pre-release counts
    as the release it precedes would (2.16.0rc1 is in ">=2.6", which packaging alone says it is not)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


@dataclass(kw_only=True, frozen=True)
class TorchSource:
    """Where one torch version of a device comes from, when not (only) from the default index."""

    version: str
    #: an index searched before the default one (uv: the first index that has a package wins)
    index_url: str | None = None
    #: a folder (absolute) or URL of wheels
    find_links: str | None = None
    #: let the resolver take pre-releases
    pre: bool = False
    #: the source as the matrix file names it (records and reports show this, never a resolved path)
    label: str = ""

    @property
    def prerelease(self) -> bool:
        from packaging.version import Version

        return Version(self.version).is_prerelease


def parse_scenarios_dirs(value: Any, where: str, base: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where} must be a list of folders (relative to the matrix file)")
    dirs = []
    for v in value:
        folder = (base / v).resolve()
        if not folder.is_dir():
            raise ValueError(f"{where}: no folder {v!r} (looked for {folder})")
        dirs.append(str(folder))
    if len(set(dirs)) != len(dirs):
        raise ValueError(f"{where} lists a folder twice")
    return tuple(dirs)


def parse_install(value: Any, where: str, base: Path) -> dict[str, tuple[str, ...]]:
    """A list (every torch version) or a mapping of torch ranges to lists."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if isinstance(value, list):
        return {"": _install_entries(value, where, base)} if value else {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a list of packages, or map torch version ranges (\">=2.6\") to lists")
    out = {}
    for spec, entries in value.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            raise ValueError(f"{where}: bad torch version range {spec!r}") from None
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{where}: {spec!r} must map to a non-empty list of packages")
        out[str(spec)] = _install_entries(entries, f"{where}: {spec!r}", base)
    return out


def _install_entries(entries: list, where: str, base: Path) -> tuple[str, ...]:
    """Requirements as they are; local paths (``./pkg``, ``../dist/x.whl``: anything that is not a
    requirement) resolved from ``base``: a package folder installs editable, an archive as a file."""
    from packaging.requirements import InvalidRequirement, Requirement

    args: list[str] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise ValueError(f"{where}: bad entry {entry!r} (a requirement like \"mypkg==1.2\" or a path like \"./mypkg\")")
        try:
            Requirement(entry)
            args.append(entry)
            continue
        except InvalidRequirement:
            pass
        path = (base / entry).expanduser().resolve()
        if path.is_dir():
            if not (path / "pyproject.toml").is_file() and not (path / "setup.py").is_file():
                raise ValueError(f"{where}: {entry!r} is a folder but not a package (no pyproject.toml or setup.py)")
            args += ["-e", str(path)]
        elif path.is_file() and path.name.endswith(_ARCHIVES):
            args.append(str(path))
        elif path.exists():
            raise ValueError(f"{where}: {entry!r} is neither a package folder nor a wheel or sdist")
        else:
            raise ValueError(f"{where}: {entry!r} is not a requirement, and there is no such path (looked for {path})")
    return tuple(args)


def parse_source(entry: dict, where: str, base: Path) -> TorchSource:
    """A ``torch`` list entry with its own source: {version, index_url | find_links, pre}."""
    for key in entry:
        if key not in _SOURCE_KEYS:
            raise ValueError(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(_SOURCE_KEYS))})")
    version = entry.get("version")
    if not isinstance(version, str) or not SOURCE_VERSION.match(version):
        raise ValueError(f"{where}: bad version {version!r} in a source entry (\"X.Y.Z\", or a pre-release "
                         f"like \"2.16.0rc1\" or \"2.16.0.dev20260301\")")
    where = f"{where}[{version}]"
    index_url, find_links, pre = entry.get("index_url"), entry.get("find_links"), entry.get("pre", False)
    if index_url is None and find_links is None and not pre:
        raise ValueError(f"{where}: give index_url, find_links or pre: true (else write the version as a string)")
    if index_url is not None and (not isinstance(index_url, str) or not _URL.match(index_url)):
        raise ValueError(f"{where}.index_url must be an http(s):// or file:// URL, got {index_url!r}")
    if not isinstance(pre, bool):
        raise ValueError(f"{where}.pre must be true or false, got {pre!r}")
    resolved = None
    if find_links is not None:
        if not isinstance(find_links, str) or not find_links:
            raise ValueError(f"{where}.find_links must be a folder (relative to the matrix file) or a URL")
        if _URL.match(find_links):
            resolved = find_links
        else:
            folder = (base / find_links).resolve()
            if not folder.is_dir():
                raise ValueError(f"{where}.find_links: no folder {find_links!r} (looked for {folder})")
            resolved = str(folder)
    from packaging.version import Version

    if Version(version).is_prerelease and not pre:
        raise ValueError(f"{where}: {version} is a pre-release: add pre: true")
    label = "; ".join([*([f"index {index_url}"] if index_url else []), *([f"find-links {find_links}"] if find_links else []),
                       *(["pre-releases allowed"] if pre else [])])
    return TorchSource(version=version, index_url=index_url, find_links=resolved, pre=pre, label=label)
