"""Where the workers find the patches module under test when the run starts elsewhere.

The workers run in the project's folder (``harness.launch.launcher``), not in the folder
``run`` was started from, so a module named relative to the caller (``--patches
my_patches.py``, or ``--patches mypkg.fsdp_patches`` importable only from the caller's
folder) would not be found there. The launcher gives the workers the file's absolute path,
and adds the folder a dotted module was found under to their ``PYTHONPATH``.
"""

from __future__ import annotations

import site
import sys
from pathlib import Path

from harness.undertest.source import is_path, locate

__all__ = ["caller_folder_importable", "import_root", "worker_spec"]


def caller_folder_importable() -> None:
    """``--patches mypkg.fsdp_patches`` finds ``mypkg`` in the folder the command runs in,
    as ``python -m harness`` does, when run as the ``fsdp-compat`` script too (whose
    ``sys.path`` starts at the script's folder). Appended: an installed package of the
    same name wins."""
    cwd = Path.cwd()
    if not any(Path(p or ".").resolve() == cwd for p in sys.path):
        sys.path.append(str(cwd))


def worker_spec(spec: str, workers_folder: Path) -> str:
    """``spec`` as the workers, running in ``workers_folder``, import it: a dotted name, or a
    path that leads there to the same file, as it is (records and reasons name it as the
    user did); another path made absolute."""
    if not is_path(spec) or Path(spec).is_absolute():
        return spec
    here = Path(spec).resolve()
    return spec if (workers_folder / spec).resolve() == here else str(here)


def import_root(spec: str, *, known: list[str] | None = None) -> Path | None:
    """The folder on ``sys.path`` the dotted module ``spec`` was found under, where the
    workers would not search it (None for a path, an unknown module, a module under a
    site-packages folder or one of ``known``). A site folder is never returned: put on
    ``PYTHONPATH`` it would move ahead of a venv's own packages."""
    if is_path(spec):
        return None
    try:
        found = locate(spec)
    except ValueError:
        return None
    root = found.path.parents[spec.count(".")]
    skip = {*site.getsitepackages(), site.getusersitepackages(), *(p for p in sys.path if p.endswith("-packages")),
            *(known or [])}
    if any(root == Path(p).resolve() for p in skip if p):
        return None
    return root
