"""What the scenario library offers, read from its files without importing them (so
``matrix.yaml`` can be checked where torch is not installed, e.g. in nox's process).

Names: a file that assigns ``SCENARIO`` is named after itself unless it passes
``name="..."``; every ``name="..."`` given to ``Scenario(...)`` or ``.replace(...)``
names one too (a ``name=`` given to any other call, e.g. ``PublicApi(name=...)``, does not). World sizes: the literal ``world_sizes=(...)`` tuples, plus the
default of ``harness.spec.Scenario``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from harness.vocabulary import DEFAULT_WORLD_SIZES

__all__ = ["Catalog", "read_catalog"]

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"


@dataclass(kw_only=True, frozen=True)
class Catalog:
    names: frozenset[str]
    world_sizes: frozenset[int]


def _names_a_scenario(call: ast.Call) -> bool:
    """``Scenario(...)`` or ``<anything>.replace(...)``: the calls whose ``name=`` names a scenario."""
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "Scenario") or (
        isinstance(func, ast.Attribute) and func.attr in ("Scenario", "replace"))


def read_catalog(folder: Path = SCENARIOS_DIR) -> Catalog:
    names: set[str] = set()
    sizes: set[int] = set(DEFAULT_WORLD_SIZES)
    for file in sorted(folder.glob("*.py")):
        if file.name.startswith("_"):
            continue
        try:
            tree = ast.parse(file.read_text(), filename=str(file))
        except SyntaxError:
            continue  # reported when the run loads the library
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "name" and _names_a_scenario(node) and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, str):
                    names.add(kw.value.value)
                elif kw.arg == "world_sizes" and isinstance(kw.value, (ast.Tuple, ast.List)):
                    sizes |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, int)}
        own = [n.value for n in tree.body if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "SCENARIO" for t in n.targets)]
        # SCENARIO is named after its file unless its own call passes name= (others in the file may)
        if own and not (isinstance(own[-1], ast.Call) and any(kw.arg == "name" for kw in own[-1].keywords)):
            names.add(file.stem)
    return Catalog(names=frozenset(names), world_sizes=frozenset(sizes))
