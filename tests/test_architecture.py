"""The shape of harness/: small modules, no import cycles."""

import ast

from tests.conftest import ROOT

HARNESS = ROOT / "harness"


def _imports(path):
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            parts = node.module.split(".")
            deps |= {a.name for a in node.names} if len(parts) == 1 else {parts[1]}
        elif isinstance(node, ast.Import):
            deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("harness.")}
    return deps


def test_no_module_over_300_lines():
    long = {p.name: n for p in HARNESS.glob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


def test_no_import_cycle():
    modules = {p.stem for p in HARNESS.glob("*.py")}
    graph = {p.stem: _imports(p) & modules - {p.stem} for p in HARNESS.glob("*.py")}
    done: set[str] = set()

    def visit(name, path):
        assert name not in path, "import cycle: " + " -> ".join([*path, name])
        if name in done:
            return
        for dep in graph[name]:
            visit(dep, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_the_vocabulary_module_is_torch_free():
    tree = ast.parse((HARNESS / "names.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"annotations", "__future__"}
