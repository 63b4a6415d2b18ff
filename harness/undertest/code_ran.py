"""Which code of the patches module under test a cell ran, each piece hashed.

A cell that installs patches depends on the code of the module under test that ran in it, not on every file of the
module: a deployed cell installs every patch, yet a wrapper whose torch function the scenario never calls cannot
change its outcome. The workers import the module under test through ``ProbedLoader``: every function's body starts
with one added statement that notes the function's id (``RAN``); a file's top-level code is noted when the file is
imported. Nothing else of the module's code changes (same file, same line numbers in tracebacks; its ``.pyc`` is
neither read nor written). Each rank reports what ran with its digests (``report``), the record keeps them
(``code_deps``), and a later run reuses the record only where every one still hashes the same in the source on disk
(``CodeIndex``, ``harness.launch.incremental``).

Ids: ``<file>::<qualified name>`` (``nonfloat.py::_nonfloat_frozen.new``; a second function of the same name in one
scope gets ``#2``), ``<file>::<module>`` for a file's top-level code, and ``<file>`` alone (its bytes) for a file of
the module imported some other way. ``<file>`` is relative to the module's folder (a single-file module: its own
name). Digests hash the syntax tree, so comments, blank lines and line numbers do not count; a function's digest
leaves out the bodies of the functions defined in it (each has its own id) but keeps their names, arguments, defaults
and decorators, which run where they are defined. A lambda or a class body is part of the function (or file) it is
written in.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

from harness.versiontags import TAG_VALUE, dict_tag

__all__ = ["MODULE", "RAN", "CodeIndex", "ProbedLoader", "begin", "digests", "install_finder", "merge", "precompile", "report"]

#: the id suffix of a file's top-level code
MODULE = "<module>"
#: the name the added statements call, set in each probed module's namespace
PROBE = "__fsdp_compat_ran__"
#: ids of the module under test's code that ran in this process since the last ``RAN.clear()``
RAN: set[str] = set()
#: file (relative id) -> its digests, for every file imported through ``ProbedLoader`` here
_LOADED: dict[str, dict[str, str]] = {}
_Def = (ast.FunctionDef, ast.AsyncFunctionDef)


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function in ``tree``, outermost first."""
    def walk(node: ast.AST, prefix: str, counts: dict[str, int]) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (*_Def, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                counts[name] = counts.get(name, 0) + 1
                if counts[name] > 1:
                    name = f"{name}#{counts[name]}"
                if isinstance(child, _Def):
                    yield name, child
                yield from walk(child, f"{name}.", counts)
            elif not isinstance(child, ast.Lambda):
                yield from walk(child, prefix, counts)

    yield from walk(tree, "", {})


def _inner_defs(node: ast.AST) -> Iterator[ast.AST]:
    """The functions defined directly inside ``node`` (not inside one of those)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _Def):
            yield child
        else:
            yield from _inner_defs(child)


def _hash(node: ast.AST) -> str:
    """``node``'s digest, the bodies of the functions defined in it left out."""
    inner = list(_inner_defs(node))
    bodies = [d.body for d in inner]
    for d in inner:
        d.body = [ast.Pass()]
    try:
        return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:20]
    finally:
        for d, body in zip(inner, bodies):
            d.body = body


def digests(source: str | bytes, filename: str = "<patches>") -> dict[str, str]:
    """Qualified name (and ``MODULE``) -> digest, for one file's source."""
    tree = ast.parse(source, filename=filename)
    return {MODULE: _hash(tree), **{name: _hash(node) for name, node in list(functions(tree))}}


def _instrument(tree: ast.Module, file_id: str) -> ast.Module:
    """``tree`` with ``__fsdp_compat_ran__("<file_id>::<name>")`` first in every function body
    (after its docstring)."""
    for name, node in list(functions(tree)):
        probe = ast.Expr(ast.Call(ast.Name(PROBE, ast.Load()), [ast.Constant(f"{file_id}::{name}")], []))
        first = node.body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
            isinstance(first.value.value, str)
        ast.copy_location(probe, first)
        node.body.insert(1 if docstring else 0, probe)
    return ast.fix_missing_locations(tree)


#: (path, file id) -> (source, code, digests): what ``precompile`` or an import compiled
_COMPILED: dict[tuple[str, str], tuple[bytes, object, dict[str, str]]] = {}


def _compiled(path: str, fid: str, source: bytes) -> tuple[object, dict[str, str]]:
    """The probed code of ``source`` and its digests (compiled once per source text)."""
    cached = _COMPILED.get((path, fid))
    if cached is None or cached[0] != source:
        tree = ast.parse(importlib.util.decode_source(source), filename=path)
        found = digests(source, path)
        cached = _COMPILED[(path, fid)] = (source, compile(_instrument(tree, fid), path, "exec", dont_inherit=True),
                                           found)
    return cached[1], dict(cached[2])


def precompile(root: Path) -> None:
    """Compile the probed code of every file under ``root`` without running any, and note which imported modules lie under
    no root (a process that forks cells does this once: each cell's import then costs what one from ``.pyc`` does)."""
    root = root.resolve()
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        try:
            _compiled(str(path), file_id(path, root), path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue  # the import says what is wrong, under the cell's watchdog
    _unprobed_under([root])


def file_id(path: Path, root: Path) -> str:
    """``path``'s id: relative to ``root`` (a folder), or its name (``root`` is the file)."""
    return path.name if root.is_file() or root == path else path.resolve().relative_to(root.resolve()).as_posix()


class ProbedLoader(importlib.machinery.SourceFileLoader):
    """Imports one file of the module under test with its probes in."""

    def __init__(self, fullname: str, path: str, root: Path) -> None:
        super().__init__(fullname, path)
        self.file_id = file_id(Path(path), root)

    def get_code(self, fullname: str):
        source = self.get_data(self.path)
        try:
            code, _LOADED[self.file_id] = _compiled(self.path, self.file_id, source)
        except (SyntaxError, ValueError):
            RAN.add(self.file_id)  # its bytes: fixing it changes what the cell would do
            raise
        return code

    def exec_module(self, module) -> None:
        module.__dict__[PROBE] = RAN.add
        RAN.add(f"{self.file_id}::{MODULE}")
        super().exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Gives a ``ProbedLoader`` to every module whose file lies under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def find_spec(self, fullname, path, target=None):
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.origin and spec.origin.endswith(".py") and _located(spec.origin, [self.root])[1] is not None:
                spec.loader = ProbedLoader(fullname, spec.origin, self.root)
            return spec
        return None


def begin() -> None:
    """Forget what ran: a new patch set is about to be imported and installed."""
    RAN.clear()


def merge(reports) -> dict[str, str]:
    """Several ranks' ``report()`` in one; an id two ranks hashed differently (its file changed in between) is ``"?"``."""
    merged: dict[str, str] = {}
    for report in reports:
        for dep, digest in (report or {}).items():
            merged[dep] = digest if merged.get(dep, digest) == digest else "?"
    return dict(sorted(merged.items()))


def install_finder(root: Path) -> None:
    """Probe every module imported from now on whose file lies under ``root`` (once per root)."""
    root = root.resolve()
    if not any(isinstance(f, _Finder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(root))


def report() -> dict[str, str]:
    """What of the modules under test (each root ``install_finder`` was given) ran here since ``begin``, hashed:
    the probed code that ran, each probed file's top-level code, the bytes of any file imported without probes."""
    roots = [f.root for f in sys.meta_path if isinstance(f, _Finder)]
    found = {i: _LOADED.get(i.split("::")[0], {}).get(i.split("::", 1)[1], "?") for i in RAN if "::" in i}
    found |= {i: d for i in RAN if "::" not in i for r in roots if (d := CodeIndex(r).current(i)) is not None}
    found |= {f"{f}::{MODULE}": d[MODULE] for f, d in _LOADED.items()}
    for path, fid in _unprobed_under(roots):
        found[fid] = _bytes_digest(path)
    return dict(sorted(found.items()))


def _bytes_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:20]


#: ``sys.modules`` name -> (a weak reference to the module seen there, the roots it was looked at for, its file under one
#: of them with its id, or None): each module looked at once (a forked cell inherits what its zygote's ``precompile`` saw)
_SCANNED: dict[str, tuple[object, tuple[str, ...], tuple[Path, str] | None]] = {}
_LAST: list = [None, (), []]  #: the last scan: ``sys.modules``' dict version tag, the roots, what it found


def _unprobed_under(roots: list[Path]) -> list[tuple[Path, str]]:
    """The ``.py`` files of imported modules, imported without probes, under one of ``roots``, with their ids."""
    key, tag = tuple(map(str, roots)), TAG_VALUE(dict_tag(sys.modules))
    if _LAST[0] == tag and _LAST[1] == key:  # no module added, removed or replaced since
        return _LAST[2]
    found = []
    for name, module in list(sys.modules.items()):
        seen = _SCANNED.get(name)
        if seen is None or seen[1] != key or seen[0]() is not module:  # type: ignore[operator]
            seen = _SCANNED[name] = (_weak(module), key, _file_under(module, roots))
        if seen[2] is not None:
            found.append(seen[2])
    _LAST[:] = [tag, key, found]
    return found


def _weak(module: object):
    try:
        return weakref.ref(module)
    except TypeError:  # an object that is no module and takes no weak reference: looked at on every scan
        return lambda: None


def _file_under(module: object, roots: list[Path]) -> tuple[Path, str] | None:
    name = getattr(module, "__file__", None)
    if isinstance(getattr(module, "__loader__", None), ProbedLoader) or not isinstance(name, str) \
            or not name.endswith(".py"):
        return None
    real, root = _located(name, roots)
    return (Path(real), file_id(Path(real), root)) if root is not None and os.path.isfile(real) else None


_REAL_DIRS: dict[str, str] = {}  #: a folder as imported -> its real path (thousands of modules, a few hundred folders)


def _located(name: str, roots: list[Path]) -> tuple[str, Path | None]:
    """``name``'s real path (``Path(name).resolve()``, each folder resolved once, the file itself
    where it is a link) and the first of ``roots`` that it is or lies under (None: none)."""
    folder, base = os.path.split(name)
    if os.path.islink(name) or not os.path.isabs(folder):
        real = os.path.realpath(name)
    else:
        real = os.path.join(_REAL_DIRS.get(folder) or _REAL_DIRS.setdefault(folder, os.path.realpath(folder)), base)
    return real, next((r for r in roots if real == str(r) or real.startswith(os.path.join(str(r), ""))), None)


class CodeIndex:
    """The digests of the module under test as it is on disk now (read, never imported)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._files: dict[str, dict[str, str] | None] = {}
        #: each piece's digest, looked up once (a rerun asks for the same pieces for hundreds of records)
        self._known: dict[str, str | None] = {}

    def current(self, dep: str) -> str | None:
        """``dep``'s digest now; None where its file or function is gone (or does not parse)."""
        if dep not in self._known:
            self._known[dep] = self._look(dep)
        return self._known[dep]

    def _look(self, dep: str) -> str | None:
        rel, _, name = dep.partition("::")
        path = self.root if self.root.is_file() else self.root / rel
        if not path.is_file():
            return None
        if not name:
            return _bytes_digest(path)
        if rel not in self._files:
            try:
                self._files[rel] = digests(path.read_bytes(), str(path))
            except SyntaxError:
                self._files[rel] = None
        return (self._files[rel] or {}).get(name)

    def unchanged(self, deps: dict[str, str]) -> bool:
        return all(self.current(dep) == digest for dep, digest in deps.items())
