"""Import a Python file or package folder by path (scenario folders, patches modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["import_file"]


def import_file(path: str | Path, name: str, loader: Any = None) -> ModuleType:
    """Import ``path`` (a ``.py`` file, or a package folder holding ``__init__.py``) as
    module ``name``, cached in ``sys.modules``; a failing import leaves no
    half-initialized module behind. ``loader(name, file)``: the loader to use (default: Python's)."""
    if name in sys.modules:
        return sys.modules[name]
    path = Path(path)
    if path.is_dir():
        file = path / "__init__.py"
        spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=[str(path)],
                                                      loader=loader(name, str(file)) if loader else None)
    else:
        spec = importlib.util.spec_from_file_location(name, path, loader=loader(name, str(path)) if loader else None)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
        raise
    return module
