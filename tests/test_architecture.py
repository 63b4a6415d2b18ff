"""The shape of harness/: role folders, small modules, no import cycles between folders."""

import ast

from tests.support import ROOT

HARNESS = ROOT / "harness"
MODULES = sorted(p for p in HARNESS.rglob("*.py"))


def _unit(path) -> str:
    """A folder of harness/ ("train"), or a top-level module ("cli")."""
    rel = path.relative_to(HARNESS)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _harness_imports(path) -> set[str]:
    """Dotted harness modules that ``path`` imports (``harness.train.recipe``, ``harness.cli``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            if node.module == "harness":
                found |= {f"harness.{a.name}" for a in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("harness.")}
    return found


def test_no_module_over_300_lines():
    long = {str(p.relative_to(HARNESS)): n for p in MODULES if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


def test_at_most_15_modules_at_the_top():
    top = sorted(p.name for p in HARNESS.glob("*.py"))
    assert len(top) <= 15, top


def test_every_folder_says_its_role_in_one_line():
    for folder in (p for p in HARNESS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
                   and p.name != "templates"):
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.name}/ has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) == 1, f"{folder.name}/__init__.py: the role in one line"


def test_no_import_cycle_between_folders():
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        unit = _unit(path)
        deps = {m.split(".")[1] for m in _harness_imports(path) if len(m.split(".")) > 1}
        graph.setdefault(unit, set()).update(deps - {unit})
    done: set[str] = set()

    def visit(name, path):
        assert name not in path, "import cycle: " + " -> ".join([*path, name])
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_no_module_outside_the_nox_layer_reaches_it():
    """A cell's key leaves harness/envs/ out of the harness's code (``harness.plan.inputs.harness_files``):
    sound only while nothing a run, a launch or a rank executes imports or starts it."""
    from harness.plan.inputs import harness_files

    envs = HARNESS / "envs"
    for path in MODULES:
        if envs in path.parents:
            continue
        assert path in harness_files()
        assert not {m for m in _harness_imports(path) if m.startswith("harness.envs")}, path
        tree = ast.parse(path.read_text())
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and id(n) not in prose]
        assert not [s for s in strings if "harness.envs" in s or "harness/envs" in s], path
    assert not [p for p in harness_files() if envs in p.parents]


def test_results_and_scenario_scan_need_no_torch():
    """The report, diff and matrix checks run where torch is not installed (nox's own process)."""
    torch_free = [HARNESS / "vocabulary.py", HARNESS / "scenario" / "scan.py", HARNESS / "envs" / "matrix.py",
                  *(HARNESS / "results").glob("*.py")]
    for path in torch_free:
        tree = ast.parse(path.read_text())
        top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top_level if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in top_level if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in names if n.split(".")[0] == "torch"}, f"{path.name} imports torch at module level"


#: the folders in the order data flows through a run
FLOW = ("scenario", "undertest", "envs", "plan", "launch", "process", "rank", "train", "results", "repro")


def tree_markdown() -> str:
    """harness/ as the README shows it: each folder, its role (its ``__init__``'s line) and modules;
    then the top-level modules. ``python tests/test_architecture.py`` prints it."""
    lines = ["```text", "harness/"]
    folders = [p for p in HARNESS.iterdir() if (p / "__init__.py").is_file()]
    for folder in sorted(folders, key=lambda p: (FLOW.index(p.name) if p.name in FLOW else len(FLOW), p.name)):
        role = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())).splitlines()[0]
        modules = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
        lines += [f"  {folder.name + '/':<12} {role}", f"  {'':<12}   {', '.join(modules)}"]
    top = sorted(p.stem for p in HARNESS.glob("*.py") if not p.name.startswith("__"))
    lines += [f"  {'(top)':<12} {', '.join(top)}", "```"]
    return "\n".join(lines) + "\n"


def test_readme_shows_the_tree():
    import re

    m = re.search(r"<!-- tree:start -->\n(.*?)<!-- tree:end -->", (ROOT / "README.md").read_text(), re.S)
    assert m, "README.md has no tree block"
    assert m.group(1) == tree_markdown(), "README's tree is stale: paste `python tests/test_architecture.py` into it"


if __name__ == "__main__":
    print(tree_markdown(), end="")
