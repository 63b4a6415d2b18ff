"""Find the scenarios: every module in ``scenarios/`` (and any extra folder) that defines
``SCENARIO`` (one, named after its file unless it says otherwise) or ``SCENARIOS``
(several, each named).

A file that fails to import (a syntax error, an exception at import, a bad ``Scenario``)
does not stop the others: it becomes a ``LoadError`` naming the file and line, which the
run prints and records.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import signal
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from harness.imports import import_file
from harness.scenario.spec import Scenario

__all__ = ["Library", "LoadError", "load_scenarios", "named_scenarios", "select"]

USER_PACKAGE = "_fsdp_compat_user_scenarios"


@dataclass(kw_only=True, frozen=True)
class LoadError:
    """A scenario file that could not be loaded."""

    name: str
    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


@dataclass(kw_only=True)
class Library:
    """The scenarios found, by name, the module that defines each, and the files that failed."""

    scenarios: dict[str, Scenario] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    errors: list[LoadError] = field(default_factory=list)


def load_scenarios(extra_dirs: list[str] | None = None) -> Library:
    """All scenarios by name, in file order. Duplicate names are an error."""
    package = _project_library()
    library = Library()
    folder = Path(package.__path__[0])
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            _load(lambda n=info.name: importlib.import_module(f"scenarios.{n}"), folder / f"{info.name}.py", library)
    for extra in extra_dirs or []:
        path = Path(extra)
        if not path.is_dir():
            raise ValueError(f"scenario folder not found: {extra}")
        for file in sorted(path.glob("*.py")):
            if not file.name.startswith("_"):
                _load(lambda f=file: import_file(f, f"{USER_PACKAGE}.{f.stem}"), file, library)
    return library


def _project_library() -> ModuleType:
    """The project's ``scenarios`` package, by its path beside ``harness``: a folder or package
    of the same name in the folder a run starts from (``python -m harness`` puts it first on
    ``sys.path``) must not stand in for it."""
    import sys

    folder = Path(__file__).resolve().parents[2] / "scenarios"
    loaded = sys.modules.get("scenarios")
    if loaded is not None and [Path(p).resolve() for p in getattr(loaded, "__path__", [])] == [folder]:
        return loaded
    if loaded is not None:  # another one came first: the project's takes its name (and its submodules' names)
        for name in [m for m in sys.modules if m == "scenarios" or m.startswith("scenarios.")]:
            del sys.modules[name]
    return import_file(folder, "scenarios")


#: a scenario file whose import takes longer than this is a load error (main thread only)
IMPORT_TIMEOUT_S = 60.0


class _ImportTimeout(Exception):
    pass


@contextlib.contextmanager
def _import_deadline(seconds: float) -> Iterator[None]:
    """Interrupt an import that hangs (SIGALRM; only where this runs in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _ImportTimeout(f"the import did not finish within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _load(load, file: Path, library: Library) -> None:
    try:
        with _import_deadline(IMPORT_TIMEOUT_S):
            module = load()
        found = named_scenarios(module, file.stem)
    except Exception as e:  # the user's file is input: name it, keep going
        library.errors.append(LoadError(name=file.stem, file=_shown(file), line=_line_of(e, file),
                                        message=f"{type(e).__name__}: {_first_line(e)}"))
        return
    for s in found:
        if s.name in library.scenarios:
            raise ValueError(f"duplicate scenario name {s.name!r} in {module.__name__}")
        library.scenarios[s.name] = s
        library.modules[s.name] = module.__name__


def _line_of(e: BaseException, file: Path) -> int | None:
    if isinstance(e, SyntaxError) and e.filename and Path(e.filename).resolve() == file.resolve():
        return e.lineno
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == file.resolve()]
    return frames[-1].lineno if frames else None


def _first_line(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return e.msg
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def _shown(file: Path) -> str:
    try:
        return str(file.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def named_scenarios(module: ModuleType, stem: str) -> list[Scenario]:
    """The scenarios a module defines, with ``name`` and ``summary`` filled from the file."""
    items: list[Scenario] = list(getattr(module, "SCENARIOS", []))
    if hasattr(module, "SCENARIO"):
        items.insert(0, module.SCENARIO)
    summary = ((module.__doc__ or "").strip().splitlines() or [""])[0]
    named = []
    for s in items:
        if not isinstance(s, Scenario):
            raise TypeError(f"{module.__name__}: SCENARIO(S) must hold Scenario objects, got {type(s).__name__}")
        if not s.name:
            if s is not getattr(module, "SCENARIO", None):
                raise ValueError(f"{module.__name__}: every scenario in SCENARIOS needs a name")
            s = s.replace(name=stem)
        named.append(s if s.summary else s.replace(summary=summary))
    return named


def select(all_scenarios: dict[str, Scenario], names: list[str] | None) -> list[Scenario]:
    """The named scenarios (``ValueError`` naming an unknown one), or all of them."""
    if not names:
        return list(all_scenarios.values())
    chosen = []
    for n in names:
        if n not in all_scenarios:
            raise ValueError(f"unknown scenario {n!r} (see `python -m harness list`)")
        chosen.append(all_scenarios[n])
    return chosen
