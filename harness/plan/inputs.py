"""A cell's inputs, hashed: what a record already on disk must share with a cell for the
cell to be answered by it instead of run (``harness.launch.incremental``).

The key (``CellInputs.key``) covers, for every cell:

* the torch build (version, git hash, CUDA), read from the installed files, not imported;
* the content of every installed file (site-packages and torch's folder: an edited torch or
  transformers file under the same version; ``harness.plan.installed``);
* the device and backend, and the machine: CPU model, the CPU kernel set torch may dispatch
  to (its ISA flags, ``ATEN_CPU_CAPABILITY``), the GPU model where the cell is on CUDA;
* the Python interpreter (version, ``-O``) and the environment variables a cell's outcome may
  depend on (``ENV_PREFIXES``, ``ENV_NAMES``: torch's and its libraries' settings such as
  ``TORCH_DISTRIBUTED_DEBUG``, and the harness's own switches such as ``FSDP_COMPAT_LEDGER=0``);
* the harness's own code (every ``harness/**/*.py`` but the nox layer: ``harness_files``);
* every distribution installed in the environment (name and version: transformers, the
  ``install:`` entries of ``matrix.yaml``, ...);
* the scenario's file and every project file it imports, transitively (``scenarios/_models.py``,
  a user's helper beside their scenario);
* the cell's options: variant, world size, mesh, timeout, init, fault, isolation, expectations.

and, only for a cell that installs patches (patched, deployed, the meta-init workaround), the
module under test by name and mapping, and the files outside it that its files import
(hashed whole). Its own code is not in the key: what of it ran in the cell is on the record
(``code_deps``, ``harness.undertest.code_ran``), and the record answers the cell only while
all of that hashes the same (``harness.launch.incremental``). A vanilla or api cell does not
depend on the patches module at all; a deployed cell depends only on the patch code it ran.

``CellInputs.reference_inputs`` is the part of the key a cell's reference depends on (all but the
cell's options and the module under test): a reference kept from an earlier run is read under
it (``harness.train.reuse``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.plan.cells import Cell
from harness.plan.installed import installed_code
from harness.undertest.source import PatchSource, is_path

__all__ = ["ENV_NAMES", "ENV_PREFIXES", "PROJECT_ROOT", "CellInputs", "harness_files", "import_closure"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _files_digest(files: Iterable[Path]) -> str:
    return _digest(*(x for f in sorted(set(files)) for x in (str(f), f.read_bytes())))


def _module_file(name: str, roots: Iterable[Path]) -> list[Path]:
    """The file of module ``name`` under the first of ``roots`` that has it, with its parent
    packages' ``__init__`` files; empty where no root has it."""
    parts = name.split(".")
    for root in roots:
        base = Path(root).joinpath(*parts)
        own = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if own.is_file():
            parents = [Path(root).joinpath(*parts[:i]) / "__init__.py" for i in range(1, len(parts))]
            return [*(p for p in parents if p.is_file()), own]
    return []


@functools.lru_cache(maxsize=4096)
def _imports_in(text: str, filename: str) -> tuple[tuple[int, str, tuple[str, ...]], ...] | None:
    """The import statements of a file's ``text``: (level, module, names) each; None where it does
    not parse. A run keys hundreds of cells whose scenarios share helpers: each text is parsed once."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError:
        return None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", tuple(a.name for a in node.names)))
    return tuple(found)


def import_closure(file: Path, roots: Iterable[Path], *, skip: Iterable[str] = ()) -> frozenset[Path]:
    """``file`` and every file under ``roots`` it imports, transitively (relative imports
    included); modules whose top-level name is in ``skip`` (hashed on their own) are left out."""
    roots, skip = [Path(r) for r in roots], set(skip)
    seen: set[Path] = set()
    todo = [Path(file).resolve()]
    while todo:
        current = todo.pop()
        if current in seen or not current.is_file():
            continue
        seen.add(current)
        imports = _imports_in(current.read_text(), str(current))
        if imports is None:
            continue  # its bytes are in the key; the load reports the error
        package = current.parent
        for level, module, imported in imports:
            if level:
                base = package
                for _ in range(level - 1):
                    base = base.parent
                stem = base.joinpath(*module.split(".")) if module else base
                candidates = [stem.with_suffix(".py"), stem / "__init__.py", *(stem / f"{a}.py" for a in imported)]
                todo += [c.resolve() for c in candidates if c.is_file()]
                continue
            names = [module, *(f"{module}.{a}" for a in imported)] if imported else [module]
            for name in names:
                if name.split(".")[0] not in skip:
                    todo += [f.resolve() for f in _module_file(name, [*roots, package])]
    return frozenset(seen)


#: environment variables in a cell's key, by prefix: what torch, its communication and math
#: libraries and transformers read (``TORCH_DISTRIBUTED_DEBUG``, ``NCCL_ALGO``, ``OMP_NUM_THREADS``, ...)
ENV_PREFIXES = ("TORCH", "PYTORCH", "ATEN_", "NCCL_", "GLOO_", "CUDA_", "CUBLAS", "CUDNN", "NVIDIA_TF32", "OMP_", "MKL_",
                "KMP_", "TRANSFORMERS_", "PYTHONHASHSEED", "PYTHONOPTIMIZE")
#: the harness's own switches of what a cell checks or stamps on its record
ENV_NAMES = ("FSDP_COMPAT_LEDGER", "FSDP_COMPAT_RESOURCES", "FSDP_COMPAT_TORCH_SOURCE")
#: left out although a prefix matches: which GPU of the machine (its model is in the key)
_ENV_LEFT_OUT = ("CUDA_VISIBLE_DEVICES",)


def _environment(environ: Mapping[str, str]) -> str:
    """The interpreter and the environment variables a cell's outcome may depend on."""
    picked = sorted((k, v) for k, v in environ.items()
                    if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES) and k not in _ENV_LEFT_OUT)
    return _digest(sys.version, str(sys.flags.optimize), json.dumps(picked))


def harness_files() -> list[Path]:
    """The harness's own code a cell may run: every ``harness/**/*.py`` but ``harness/envs/``, the
    nox layer, which no other harness module imports (``tests/test_architecture.py``): it only
    decides a run's command, environment and installs, each in the key on its own."""
    envs = PROJECT_ROOT / "harness" / "envs"
    return [p for p in (PROJECT_ROOT / "harness").rglob("*.py") if envs not in p.parents]


@functools.cache
def _harness_digest() -> str:
    return _files_digest(harness_files())


@functools.cache
def _torch_build() -> str:
    """The installed torch's version, git hash and CUDA, from its files (no import)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("torch")
    except PackageNotFoundError:
        return "no torch"
    version_file = Path(str(dist.locate_file("torch/version.py")))
    text = version_file.read_text() if version_file.is_file() else ""
    return _digest(dist.version, text)


@functools.cache
def _installs() -> str:
    """Every distribution installed here, by name and version."""
    from importlib.metadata import distributions

    return _digest(*sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()))


@functools.cache
def _machine(device: str) -> str:
    from harness.results.machine import cpu_model

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = " ".join(sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma"))))
                break
    except OSError:
        pass
    gpu = ""
    if device == "cuda":
        import subprocess

        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            gpu = "unknown"
    return _digest(cpu_model() or "", flags, os.environ.get("ATEN_CPU_CAPABILITY", ""), gpu)


@dataclass(kw_only=True)
class CellInputs:
    """The keys of one run's cells: ``scenario_files`` maps a scenario name to its file."""

    scenario_files: Mapping[str, Path]
    source: PatchSource
    patch_mapping: Mapping[str, str] = field(default_factory=dict)
    isolate: str = ""
    _scenario_digests: dict[str, str] = field(default_factory=dict)

    def key(self, cell: Cell) -> str:
        options = dict(variant=cell.variant, device=cell.device, backend=cell.backend, world_size=cell.world_size,
                       mesh=list(cell.mesh), timeout_s=cell.timeout_s, init=cell.init, fault=cell.fault,
                       patches=list(cell.patches), expected=list(cell.expected), isolate=self.isolate)
        return _digest(self.reference_inputs(cell), json.dumps(options, sort_keys=True),
                       self.module_digest if cell.patches else "")

    def reference_inputs(self, cell: Cell) -> str:
        """What a cell's reference depends on besides the tensors FSDP2 produced and the words the
        referee adds (``harness.train.reuse``): every input of ``key`` but the cell's options and
        the module under test, which the reference never sees."""
        return _digest(_torch_build(), _machine(cell.device), self.environment, _harness_digest(), _installs(),
                       self.installed, self.scenario_digest(cell.scenario))

    @functools.cached_property
    def installed(self) -> str:
        """The installed files' content, the module under test's own left to ``module_digest``."""
        return installed_code((str(self.source.path.resolve()),))

    @functools.cached_property
    def environment(self) -> str:
        return _environment(os.environ)

    def scenario_digest(self, name: str) -> str:
        if name not in self._scenario_digests:
            file = self.scenario_files.get(name)
            files = import_closure(file, [PROJECT_ROOT], skip=("harness", "torch")) if file else frozenset()
            self._scenario_digests[name] = _digest(name, _files_digest(files))
        return self._scenario_digests[name]

    @functools.cached_property
    def module_digest(self) -> str:
        """The module under test by name, the patch mapping, what lies in its folder (every file's
        name; the bytes of those that are not probed Python: data, a symlink out of it), its
        parent packages' ``__init__`` files, and the files outside it that its files import
        (its own probed code: the record's ``code_deps``)."""
        source = self.source
        root = source.path.resolve()
        own = {f.resolve() for f in source.files if root == f.resolve() or root in f.resolve().parents}
        closure = set().union(*(import_closure(f, [source.path.parent], skip=("torch", "harness")) for f in own))
        listing, loose = [], set()
        if root.is_dir():
            for f in sorted(source.path.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    listing.append(f.relative_to(source.path).as_posix())
                    if f.suffix != ".py" or f.resolve() not in own:
                        loose.add(f.resolve())
        parents = [] if is_path(source.spec) else \
            [source.path.parents[i] / "__init__.py" for i in range(source.spec.count("."))]
        return _digest(source.spec, json.dumps(dict(self.patch_mapping), sort_keys=True), json.dumps(listing),
                       _files_digest((closure - own) | loose | {p for p in parents if p.is_file()}))
