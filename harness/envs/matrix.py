"""``matrix.yaml``: load and validate strictly.

Every problem is a ``ValueError`` whose message is one line naming the field, so the
command line can print it and exit 2.

Beside the cells: ``install`` (what every torch version's venv gets besides torch: pins
or local paths, for all versions or per torch range), ``scenarios_dirs`` (scenario
folders besides the project's) and, in a device's ``torch`` list, a version given as a
mapping with its own source (``{version: "2.16.0rc1", index_url: ..., pre: true}``: the
pre-release lane). Paths are relative to the matrix file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.envs.sources import (
    SOURCE_VERSION,
    TorchSource,
    in_range,
    parse_install,
    parse_scenarios_dirs,
    parse_source,
)
from harness.scenario.scan import Catalog, read_catalog
from harness.undertest.source import is_path
from harness.vocabulary import DEFAULT_MODULE

__all__ = ["DeviceMatrix", "Matrix", "load_matrix", "parse_matrix"]

_TOP_KEYS = {"patches", "patch_map", "scenarios", "scenarios_dirs", "world_sizes", "timeout_s", "devices",
             "transformers", "install", "fresh"}
_DEVICE_KEYS = {"torch", "world_sizes", "timeout_s", "slots"}
_DEVICES = ("cpu", "cuda")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(kw_only=True, frozen=True)
class DeviceMatrix:
    device: str
    torch: tuple[str, ...]
    world_sizes: tuple[int, ...]
    timeout_s: float
    #: CPU: cells of the largest world size run side by side per launch (``harness run --slots``)
    slots: int = 1
    #: version -> its own source, for the versions the matrix gives one
    sources: dict[str, TorchSource] = field(default_factory=dict)


@dataclass(kw_only=True, frozen=True)
class Matrix:
    patches: str
    patch_map: dict[str, str] = field(default_factory=dict)
    scenarios: tuple[str, ...] | None = None  # None = all
    devices: tuple[DeviceMatrix, ...] = ()
    #: torch version range -> transformers release for the hf_ pack
    transformers: dict[str, str] = field(default_factory=dict)
    #: torch version range ("" = every version) -> what every venv of that range installs
    #: (requirements, absolute wheel paths, ``-e`` + absolute folder)
    install: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: run every cell (``harness run --fresh``) instead of reusing records whose inputs are unchanged
    fresh: bool = False
    #: extra scenario folders (absolute)
    scenarios_dirs: tuple[str, ...] = ()

    def transformers_for(self, torch_version: str) -> str | None:
        """The transformers release the hf_ pack installs beside ``torch_version`` (None: the pack is skipped)."""
        return next((v for spec, v in self.transformers.items() if in_range(torch_version, spec)), None)

    def install_for(self, torch_version: str) -> list[str]:
        """``install`` arguments for the venv of ``torch_version``: every matching range's, in file order."""
        return [a for spec, args in self.install.items() if not spec or in_range(torch_version, spec) for a in args]

    def source(self, torch_version: str, device: str) -> TorchSource | None:
        """The version's own source on ``device`` (None: the default index)."""
        return self.device(device).sources.get(torch_version)

    def cells(self) -> list[tuple[str, str]]:
        """(torch version, device) pairs, one nox session each."""
        return [(v, d.device) for d in self.devices for v in d.torch]

    def device(self, name: str) -> DeviceMatrix:
        for d in self.devices:
            if d.device == name:
                return d
        raise ValueError(f"matrix.yaml: device {name!r} is not in the matrix")


def load_matrix(path: str | Path = "matrix.yaml") -> Matrix:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"matrix file not found: {path}")
    try:
        data = yaml.load(p.read_text(), Loader=_strict_loader())
    except _DuplicateKey as e:
        raise ValueError(f"{p.name}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"{p.name}: not valid YAML{where}") from e
    return parse_matrix(data, p.name, base=p.resolve().parent)


class _DuplicateKey(Exception):
    pass


def _strict_loader():
    """A safe loader that refuses a key given twice in one mapping (YAML keeps the last)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise _DuplicateKey(f"key {key!r} given twice (lines {seen[key] + 1} and "
                                        f"{key_node.start_mark.line + 1})")
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def parse_matrix(data: Any, name: str = "matrix.yaml", *, base: Path | None = None) -> Matrix:
    """``base``: the folder relative paths are taken from (the matrix file's; default: the current one)."""
    if not isinstance(data, dict):
        raise ValueError(f"{name}: the top level must be a mapping")
    _no_unknown(data, _TOP_KEYS, name)
    base = base or Path.cwd()
    patches = data.get("patches", DEFAULT_MODULE)
    if not isinstance(patches, str) or not patches:
        raise ValueError(f"{name}: 'patches' must be a module name or a .py path")
    if is_path(patches):
        path = (base / patches).resolve()
        if not path.exists():
            raise ValueError(f"{name}: 'patches': no file {patches!r} (looked for {path})")
        patches = str(path)
    patch_map = data.get("patch_map") or {}
    if not isinstance(patch_map, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in patch_map.items()):
        raise ValueError(f"{name}: 'patch_map' must map patch names to function names")
    dirs = parse_scenarios_dirs(data.get("scenarios_dirs", []), f"{name}: 'scenarios_dirs'", base)
    catalog = read_catalog()
    for folder in dirs:
        extra = read_catalog(Path(folder))
        catalog = Catalog(names=catalog.names | extra.names, world_sizes=catalog.world_sizes | extra.world_sizes)
    scenarios = data.get("scenarios", "all")
    if scenarios == "all":
        chosen = None
    elif isinstance(scenarios, list) and scenarios and all(isinstance(s, str) for s in scenarios):
        chosen = tuple(scenarios)
        for s in chosen:
            if s not in catalog.names:
                raise ValueError(f"{name}: 'scenarios': unknown scenario {s!r} (see `python -m harness list`)")
    else:
        raise ValueError(f"{name}: 'scenarios' must be 'all' or a non-empty list of names")
    world_sizes = _world_sizes(data.get("world_sizes", [1, 2, 4]), f"{name}: 'world_sizes'", catalog)
    timeout = _timeout(data.get("timeout_s", 60), f"{name}: 'timeout_s'")
    devices = data.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise ValueError(f"{name}: 'devices' must map device names (cpu, cuda) to settings")
    parsed = []
    for dev, settings in devices.items():
        where = f"{name}: devices.{dev}"
        if dev not in _DEVICES:
            raise ValueError(f"{name}: unknown device {dev!r} under 'devices' (choose from {', '.join(_DEVICES)})")
        if not isinstance(settings, dict):
            raise ValueError(f"{where} must be a mapping")
        _no_unknown(settings, _DEVICE_KEYS, where)
        entries = settings.get("torch")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{where}.torch must be a non-empty list of versions like \"2.13.0\"")
        versions, sources = [], {}
        for v in entries:
            if isinstance(v, dict):
                src = parse_source(v, f"{where}.torch", base)
                versions.append(src.version)
                sources[src.version] = src
            elif isinstance(v, str) and SOURCE_VERSION.match(v) and not _VERSION.match(v):
                raise ValueError(f"{where}.torch: {v!r} is a pre-release: give it with its source, "
                                 f"{{version: \"{v}\", index_url: ... or find_links: ..., pre: true}}")
            elif not isinstance(v, str) or not _VERSION.match(v):
                raise ValueError(f"{where}.torch: bad version {v!r} (write it as a quoted \"X.Y.Z\")")
            else:
                versions.append(v)
        if len(set(versions)) != len(versions):
            raise ValueError(f"{where}.torch lists a version twice")
        parsed.append(
            DeviceMatrix(
                device=dev,
                torch=tuple(versions),
                sources=sources,
                world_sizes=(_world_sizes(settings["world_sizes"], f"{where}.world_sizes", catalog)
                             if "world_sizes" in settings else world_sizes),
                timeout_s=_timeout(settings["timeout_s"], f"{where}.timeout_s") if "timeout_s" in settings else timeout,
                slots=_slots(settings.get("slots", 1), dev, f"{where}.slots"),
            )
        )
    return Matrix(patches=patches, patch_map=dict(patch_map), scenarios=chosen, devices=tuple(parsed),
                  transformers=_ranges(data.get("transformers", {}), f"{name}: 'transformers'"),
                  install=parse_install(data.get("install", []), f"{name}: 'install'", base), scenarios_dirs=dirs,
                  fresh=_flag(data.get("fresh", False), f"{name}: 'fresh'"))


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where} must be true or false, got {value!r}")
    return value


def _ranges(value: Any, where: str) -> dict[str, str]:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not isinstance(value, dict):
        raise ValueError(f"{where} must map torch version ranges (\">=2.6\") to releases (\"5.24.0\")")
    for spec, release in value.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            raise ValueError(f"{where}: bad torch version range {spec!r}") from None
        if not isinstance(release, str) or not _VERSION.match(release):
            raise ValueError(f"{where}: bad release {release!r} for {spec!r} (write it as a quoted \"X.Y.Z\")")
    return {str(k): v for k, v in value.items()}


def _no_unknown(d: dict, allowed: set[str], where: str) -> None:
    for key in d:
        if key not in allowed:
            raise ValueError(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")


def _world_sizes(value: Any, where: str, catalog: Catalog) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"{where} must be a non-empty list of positive integers")
    for v in value:
        if v not in catalog.world_sizes:
            raise ValueError(f"{where}: no scenario supports world size {v} "
                             f"(supported: {', '.join(map(str, sorted(catalog.world_sizes)))})")
    return tuple(value)


def _slots(value: Any, device: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be a positive integer, got {value!r}")
    if device != "cpu" and value != 1:
        raise ValueError(f"{where}: slots are for CPU launches (a {device} launch has a device per rank)")
    return value


def _timeout(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where} must be a finite number of seconds > 0, got {value!r}")
    return float(value)
