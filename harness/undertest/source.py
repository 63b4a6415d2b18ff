"""The patches module under test, read without running it.

The harness process never imports the patches module (a module that hangs or crashes
at import would take the harness with it; the workers import it under each cell's
watchdog). Reading its source is enough to name it in the report (name, ``__version__``,
content hash), to list the patch names it provides, and to catch a typo in a scenario's
``patches=`` before anything starts.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = [
    "UTILITIES", "PatchSource", "Utilities", "check_patch_names", "deployed_patches", "is_path", "locate", "near_misses", "patch_names_in"]

@dataclass(frozen=True, kw_only=True)
class Utilities:
    """The utilities a patch set provides: functions the recipe calls in place of its own step
    (a patches module's ``X_`` or ``X``), not process-global installs. A new one is a field here
    and the step that calls it (``harness.train.fsdp``)."""

    #: ``clip_grad_norm_(params, max_norm, norm_type) -> total norm``, in place of torch's
    clip_grad_norm: Callable[..., Any] | None = None
    #: ``finalize_backward(root)`` after an accumulation window run with gradient sync off
    finalize_backward: Callable[..., Any] | None = None
    #: ``scale_grads_(params, scaler)``, in place of multiplying each grad
    scale_grads: Callable[..., Any] | None = None
    #: ``set_reshard_after_forward(module, value, recurse=...)``: torch 2.8's
    #: ``FSDPModule.set_reshard_after_forward`` where torch lacks it (``ReshardAfterForward``)
    set_reshard_after_forward: Callable[..., Any] | None = None


#: Patch names that are utilities (``Utilities``' fields).
UTILITIES = tuple(f.name for f in fields(Utilities))


def is_path(spec: str) -> bool:
    """Whether ``--patches`` names a file or folder (else a dotted module name)."""
    return spec.endswith(".py") or "/" in spec


@dataclass(kw_only=True, frozen=True)
class PatchSource:
    spec: str
    path: Path
    files: tuple[Path, ...]
    #: every top-level name the module (a package: its ``__init__``) defines or imports
    names: frozenset[str]
    version: str | None
    sha256: str

    @property
    def patches(self) -> frozenset[str]:
        """The patch names it provides (``patch_fsdp_X``/``patch_X`` installs, ``X_`` utilities)."""
        return frozenset(patch_names_in(self.names))

    def describe(self) -> str:
        """Name, version and content hash, as reports show it: a module given by path is named
        by its file (or folder) name, never by where it lies on this machine."""
        name = Path(self.spec).name if is_path(self.spec) else self.spec
        version = f" {self.version}" if self.version else ""
        return f"{name}{version} (sha256 {self.sha256[:12]})"


def patch_names_in(names: Iterable[str]) -> set[str]:
    found = set()
    for n in names:
        for prefix in ("patch_fsdp_", "patch_"):
            if n.startswith(prefix) and len(n) > len(prefix):
                found.add(n[len(prefix):])
                break
        if n.rstrip("_") in UTILITIES:
            found.add(n.rstrip("_"))
    return found


def locate(spec: str) -> PatchSource:
    """Find the module's source; ``ValueError`` (one line) when there is none."""
    if is_path(spec):
        path = Path(spec)
        if not path.exists():
            raise ValueError(f"patches module file not found: {spec}")
        main = path / "__init__.py" if path.is_dir() else path
        if not main.is_file():
            raise ValueError(f"patches module folder has no __init__.py: {spec}")
    else:
        try:
            found = importlib.util.find_spec(spec)
        except (ImportError, ValueError) as e:
            raise ValueError(f"patches module {spec!r} cannot be imported: {type(e).__name__}: {e}") from e
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise ValueError(f"patches module {spec!r} cannot be imported: no module named {spec!r}")
        main = Path(found.origin)
        path = main.parent if found.submodule_search_locations else main
    files = tuple(sorted(path.rglob("*.py"))) if path.is_dir() else (main,)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(path if path.is_dir() else path.parent).as_posix().encode() + b"\0")
        digest.update(f.read_bytes())
    names, version = _top_level(main)
    return PatchSource(spec=spec, path=path, files=files, names=frozenset(names), version=version,
                       sha256=digest.hexdigest())


def _top_level(file: Path) -> tuple[set[str], str | None]:
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as e:
        raise ValueError(f"patches module {file} has a syntax error at line {e.lineno}: {e.msg}") from e
    names: set[str] = set()
    version = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__version__" and isinstance(node.value, ast.Constant):
                        version = str(node.value.value)
    return names, version


def check_patch_names(wanted: Mapping[str, Iterable[str]], sources: Iterable[PatchSource],
                      mapping: Mapping[str, str]) -> None:
    """``ValueError`` naming the first scenario patch name that no module and no mapping knows.

    ``wanted`` maps scenario name -> its patch names. A name the module under test lacks
    but the project's own module provides is not a typo: the cell says "not provided".
    """
    known = set(mapping)
    for source in sources:
        known |= source.patches
    for scenario, names in wanted.items():
        for name in names:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"scenario {scenario!r} names unknown patch {name!r}{hint}")


def near_misses(source: PatchSource, vocabulary: Iterable[str], mapping: Mapping[str, str]) -> list[str]:
    """Warnings for functions of the module that look like a misspelt known patch the
    module lacks (``patch_fsdp_unused_param_reductoin``): as written, that patch is "not
    provided" and the misspelt one installs only in the deployed set."""
    known = set(vocabulary)
    provided = source.patches | set(mapping)
    warnings = []
    for name in sorted(source.patches - known - patch_names_in(mapping.values())):
        close = [c for c in difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85) if c not in provided]
        if close:
            function = next((n for n in sorted(source.names) if n.endswith(name) and n.startswith("patch_")), name)
            warnings.append(f"{source.spec}: {function} looks like a misspelling of patch {close[0]!r}, which the "
                            f"module does not provide (its cells will say 'not provided'; --patch-map "
                            f"{close[0]}={function} maps it)")
    return warnings


def deployed_patches(vocabulary: Iterable[str], source: PatchSource, mapping: Mapping[str, str]) -> tuple[str, ...]:
    """What users ship: every patch of the library's vocabulary, in the order the scenarios
    first name them (those the module lacks install as "not-provided"), then the module's
    other ``patch_*`` functions. Functions reached through ``mapping`` count once."""
    mapped_targets = patch_names_in(mapping.values())
    order = list(dict.fromkeys(vocabulary))
    order += sorted(source.patches - set(order) - mapped_targets)
    return tuple(order)
