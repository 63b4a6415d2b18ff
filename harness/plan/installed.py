"""The installed code a cell may run, by content: part of every cell's key
(``harness.plan.inputs``).

The installs are in the key by name and version, and torch by its build (version, git hash),
but a file of an installed package can change under the same version: a fix from an upstream
pull request applied to ``site-packages/torch`` to see whether a patch can retire, a print
left in ``transformers`` while debugging, a development build of torch rebuilt from an edited
checkout. A cell whose record predates such an edit must run again, so the key also holds
the content of every file in the interpreter's site-packages folders and in torch's own
folder (a development checkout lies outside them). Compiled bytecode (``__pycache__``) and
the packages' metadata (``*.dist-info``, ``*.egg-info``: name and version are in the key
already, and an editable reinstall rewrites them) are left out.

Hashing every file each run would cost seconds (a matrix venv holds about 23,000 files,
950 MB), so each file's digest is kept beside the venv (``<prefix>/.fsdp-compat/installed-files.json``)
with its size, modification and change times and inode, and a file is read again only where
one of those moved. A write to a file always moves its change time (``touch`` cannot set it
back), so an edit is never missed; a reinstall of the same content moves the times, costs
one hashing pass, and keeps the key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import site
import sys
import sysconfig
from pathlib import Path

__all__ = ["CACHE_NAME", "content_digest", "installed_code", "installed_roots"]

#: the digest cache's file, in ``<sys.prefix>/.fsdp-compat/``
CACHE_NAME = "installed-files.json"
_SKIPPED_DIRS = ("__pycache__",)
_SKIPPED_SUFFIXES = (".dist-info", ".egg-info")
_FORMAT = 1


def installed_roots() -> list[Path]:
    """The folders whose files the key holds: site-packages (pure and platform), the user's
    site-packages where Python reads it, and torch's package folder where it lies outside them."""
    found = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    if site.ENABLE_USER_SITE:
        found.add(site.getusersitepackages())
    roots = sorted({Path(p).resolve() for p in found if p and os.path.isdir(p)})
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("torch")  # without importing it
        folder = Path(next(iter(spec.submodule_search_locations))).resolve() if spec else None
        if folder is not None and not any(r == folder or r in folder.parents for r in roots):
            roots.append(folder)
    return roots


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """(path relative to ``root``, its stat) for every file under ``root`` but the skipped ones."""
    out, stack, cut = [], [str(root)], len(str(root)) + 1
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIPPED_DIRS and not entry.name.endswith(_SKIPPED_SUFFIXES):
                        stack.append(entry.path)
                elif entry.is_file() and not entry.name.endswith(".pyc"):
                    out.append((entry.path[cut:], entry.stat()))
            except OSError:  # removed meanwhile
                continue
    return out


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:32]


def content_digest(roots: list[Path], cache: Path | None, leave_out: tuple[str, ...] = ()) -> str:
    """One digest of the content of every file under ``roots`` (by path relative to its root) but
    those in ``leave_out`` (files or folders), files read only where ``cache`` has no digest for
    their current stat; ``cache`` is rewritten where anything moved (None, or a folder that cannot
    be written: every file is read)."""
    skipped = tuple(f"{p.rstrip('/')}/" for p in leave_out)
    known: dict = {}
    if cache is not None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(cache.read_text())
            known = data["files"] if data.get("format") == _FORMAT else {}
    fresh, h, changed = {}, hashlib.sha256(), False
    for n, root in enumerate(roots):
        for rel, st in sorted(_walk(root)):
            where = f"{root}/{rel}"
            stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            entry = known.get(where)
            if entry is None or entry[:4] != stamp:
                try:
                    entry, changed = [*stamp, _file_digest(where)], True
                except OSError:  # unreadable or removed meanwhile: named, not hashed
                    entry = [*stamp, "unreadable"]
            fresh[where] = entry
            if where not in leave_out and not where.startswith(skipped):
                h.update(f"{n}\0{rel}\0{entry[4]}\n".encode())
    if cache is not None and (changed or fresh.keys() != known.keys()):
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"format": _FORMAT, "files": fresh}))
            os.replace(tmp, cache)
        except OSError:  # a read-only or full disk: the next run reads the files again
            with contextlib.suppress(OSError):
                tmp.unlink()
    return h.hexdigest()


def _cache_file() -> Path:
    """Beside the venv where it can be written; else (a system Python) in the user's cache folder,
    by the interpreter's prefix."""
    beside = Path(sys.prefix) / ".fsdp-compat"
    if os.access(beside if beside.is_dir() else sys.prefix, os.W_OK):
        return beside / CACHE_NAME
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "fsdp-compat" / f"{hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]}-{CACHE_NAME}"


@functools.cache
def installed_code(leave_out: tuple[str, ...] = ()) -> str:
    """``content_digest`` of this interpreter's ``installed_roots``, its cache beside the venv;
    ``leave_out``: the module under test where it is installed (a cell's key holds the code of it
    that the cell ran, and a vanilla cell's none of it: an edit must not rerun every cell)."""
    return content_digest(installed_roots(), _cache_file(), tuple(sorted(leave_out)))
