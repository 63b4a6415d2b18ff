"""Public training stacks as data: which of their FSDP2 patches the harness judges, and how.

A stack entry is a module of ``stacks/`` (``stacks/torchtitan.py``): ``STACK = Stack(...)``
(name, released version, the distribution the wheel is fetched as, and what is ``Judged``)
plus the project's own shims, functions named as the harness's patch names or mapped onto
them, which call the stack's code as it ships. The stack's code is never committed: its wheel
is fetched without dependencies into a cache (``fetch``), unpacked, and the shim loads the
named functions of the named file by path (``StackCode``,
``harness.undertest.extract``). The entry module is the patches module under test for its
stack's runs (``harness stacks run``, ``nox -s stacks``); the report's "Public stacks" section
reads them back.

This module does not import torch: ``fetch`` runs where nox runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["CACHE_ENV", "STACKS_DIR", "Judged", "Stack", "StackCode", "fetch", "load_stacks", "unpacked"]

#: where fetched stacks are unpacked (``harness stacks`` sets it for the workers)
CACHE_ENV = "FSDP_COMPAT_STACKS_CACHE"
DEFAULT_CACHE = Path("runs") / "stacks" / "wheels"
#: the project's stack entries
STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


@dataclass(kw_only=True, frozen=True)
class Judged:
    """One patch function of a stack, judged in the cells of ``scenarios``."""

    #: what the stack ships, as its users call it ("clip_grad_norm_(..., ep_enabled=True)")
    function: str
    #: the file of the wheel it lives in
    where: str
    #: the bug letters it works around
    bugs: str
    #: the harness patch name it stands in for
    patch: str
    #: the entry module's function that the patch name maps to (``--patch-map patch=shim``)
    shim: str
    #: the scenarios whose vanilla and patched cells decide its status
    scenarios: tuple[str, ...]
    #: why it cannot be judged on CPU ("" where it can): the report says so instead of a status
    cpu: str = ""

    def __post_init__(self) -> None:
        if not self.scenarios:
            raise ValueError(f"Judged {self.function}: name the scenarios that judge it")

    @property
    def key(self) -> str:
        """A short, file-safe name of this judged function within its stack."""
        return self.shim.strip("_")


@dataclass(kw_only=True, frozen=True)
class Stack:
    """A training stack at one release."""

    name: str
    version: str
    #: the distribution on the package index (``pip download --no-deps NAME==VERSION``)
    dist: str
    judged: tuple[Judged, ...]
    #: the entry module's file (set by ``load_stacks``)
    module: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def load_stacks(folder: Path) -> list[Stack]:
    """Every ``STACK`` of the entry modules in ``folder`` (files starting with "_" are helpers).
    Importing an entry loads nothing of its stack: its shims load the stack's code on first use."""
    stacks = []
    for path in sorted(Path(folder).glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"_stack_entry_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        stack = getattr(module, "STACK", None)
        if not isinstance(stack, Stack):
            raise ValueError(f"{path}: no STACK = Stack(...)")
        stacks.append(dataclasses.replace(stack, module=str(path)))
    return stacks


def unpacked(stack: Stack, cache: Path | None = None) -> Path:
    """Where ``stack``'s wheel is unpacked."""
    root = Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    return root / f"{stack.dist}-{stack.version}"


def fetch(stack: Stack, cache: Path) -> str | None:
    """Download ``stack``'s wheel without dependencies and unpack it (once); None when it is
    there, else one line saying why not (offline, no such release)."""
    target = unpacked(stack, cache)
    if (target / ".complete").exists():
        return None
    wheels = cache / "downloads"
    wheels.mkdir(parents=True, exist_ok=True)
    spec = f"{stack.dist}=={stack.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(wheels), spec]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{stack.label}: cannot fetch {spec} ({type(e).__name__})"
    name = stack.dist.replace("-", "_").lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{name}-{stack.version}-")]
    if res.returncode != 0 or not found:
        lines = [line for line in (res.stderr or res.stdout).splitlines() if line.startswith("ERROR")]
        return f"{stack.label}: cannot fetch {spec} ({(lines or ['pip download failed'])[-1].removeprefix('ERROR: ')})"
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extractall(target)
    (target / ".complete").write_text(found[0].name + "\n")
    return None


class StackCode:
    """``names`` of a stack's file ``where``, loaded by path on first use
    (``harness.undertest.extract``); a ``ValueError`` naming what is missing where the stack
    was not fetched or its file needs what this environment lacks."""

    def __init__(self, stack: Stack, where: str, names: tuple[str, ...], provide: dict[str, Any] | None = None) -> None:
        self._stack, self._where, self._names, self._provide = stack, where, names, provide
        self._module: ModuleType | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") and name not in self._names:
            raise AttributeError(name)
        if name not in self._names:
            raise AttributeError(f"{self._stack.label}: {name} is not among {self._names} of {self._where}")
        if self._module is None:
            self._module = self._load()
        return getattr(self._module, name)

    def _load(self) -> ModuleType:
        from harness.undertest.extract import load_functions

        path = unpacked(self._stack) / self._where
        if not path.is_file():
            raise ValueError(f"{self._stack.label}: {self._where} not found under {unpacked(self._stack)} "
                             "(fetch it: python -m harness stacks fetch)")
        module_name = f"_stack_{self._stack.name}_{Path(self._where).stem}".replace("-", "_")
        return load_functions(path, self._names, module_name=module_name, provide=self._provide)
