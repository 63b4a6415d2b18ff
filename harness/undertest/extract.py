"""Named functions of a stack's file, loaded by path without importing the stack's package.

A training stack's FSDP2 patch lives in a file that imports half the stack (its config, its
logger, its platform layer). ``load_functions`` reads the file, keeps the named functions and
what they reach at module level (other functions, classes, assignments, and the import
statements that bind the names they use), and runs just those in a fresh module; everything
else in the file, imports included, never runs. A name the caller ``provide``s (a logger, a
device lookup) is taken from the caller instead of the file. An import the kept code needs
and this venv lacks is a ``ValueError`` naming it.

The stack's code runs as it ships; nothing of it is copied into this project.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["load_functions"]

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bound(node: ast.stmt) -> set[str]:
    """The module-level names a statement binds."""
    if isinstance(node, _DEFS):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _used(node: ast.stmt) -> set[str]:
    """Names a statement reads (its body, decorators, defaults, annotations)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _kept(tree: ast.Module, names: tuple[str, ...], provided: set[str]) -> list[ast.stmt]:
    """The statements ``names`` need, in file order (``from __future__`` first)."""
    binders: dict[str, list[ast.stmt]] = {}
    for node in tree.body:
        for name in _bound(node):
            binders.setdefault(name, []).append(node)
    missing = [n for n in names if n not in binders]
    if missing:
        raise ValueError(f"no top-level {', '.join(missing)} in the file")
    keep: set[int] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        for node in binders.get(name, []):
            if id(node) in keep:
                continue
            keep.add(id(node))
            todo += [n for n in _used(node) if n in binders and n not in provided]
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    return future + [n for n in tree.body if id(n) in keep and n not in future]


def load_functions(path: Path, names: tuple[str, ...], *, module_name: str,
                   provide: dict[str, Any] | None = None) -> ModuleType:
    """A module holding ``names`` from the Python file ``path`` and what they need of it."""
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError) as e:
        raise ValueError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None
    provide = dict(provide or {})
    try:
        body = _kept(tree, names, set(provide))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    module = ModuleType(module_name, f"{', '.join(names)} of {path.name}, loaded by path")
    module.__file__ = str(path)
    module.__dict__.update(provide)
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    except ImportError as e:
        raise ValueError(f"{path}: {', '.join(names)} needs {e.name or e}, which this environment lacks") from None
    return module
