"""harness.undertest.code_ran: which code of the patches module under test ran, each piece hashed."""

import subprocess
import sys
import textwrap
import types
from pathlib import Path

from harness.undertest import code_ran
from tests.support import ROOT

SOURCE = '''
"""a patches module"""
LIMIT = 1


def patch_thing():
    """installs"""
    def wrapper(x, scale=LIMIT):
        return x * scale
    pick = lambda v: v + 1  # noqa: E731
    return wrapper, pick


class Helper:
    kind = "a"

    def method(self):
        return 2
'''


def _changed(before: str, after: str) -> set[str]:
    old, new = code_ran.digests(before), code_ran.digests(after)
    assert set(old) == set(new)
    return {k for k in old if old[k] != new[k]}


def test_each_function_is_hashed_without_the_bodies_of_the_functions_inside_it():
    assert set(code_ran.digests(SOURCE)) == {"<module>", "patch_thing", "patch_thing.wrapper", "Helper.method"}
    assert set(code_ran.digests("def f():\n    pass\ndef f():\n    pass\n")) == {"<module>", "f", "f#2"}
    assert _changed(SOURCE, SOURCE.replace("return x * scale", "return x * scale * 1")) == {"patch_thing.wrapper"}
    # what runs where a function is defined belongs to the enclosing one too: defaults, lambdas, class bodies
    assert _changed(SOURCE, SOURCE.replace("scale=LIMIT", "scale=2")) == {"patch_thing", "patch_thing.wrapper"}
    assert _changed(SOURCE, SOURCE.replace("v + 1", "v + 2")) == {"patch_thing"}
    assert _changed(SOURCE, SOURCE.replace('kind = "a"', 'kind = "b"')) == {"<module>"}
    assert _changed(SOURCE, SOURCE.replace("return 2", "return 3")) == {"Helper.method"}
    # comments, blank lines and where things sit do not count
    assert _changed(SOURCE, "\n\n# a comment\n" + SOURCE.replace("return 2", "return 2  # two")) == set()


def _module(tmp_path, body: str = SOURCE):
    pkg = tmp_path / "mypatches"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .impl import patch_thing, Helper\n")
    (pkg / "impl.py").write_text(body)
    (pkg / "unprobed.py").write_text("VALUE = 3\n")
    return pkg


def test_a_module_imported_through_the_loader_reports_what_ran_with_the_digests_on_disk(tmp_path):
    pkg = _module(tmp_path)
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from harness.undertest import code_ran
        from harness.undertest.install import load_patches_module
        module = load_patches_module({str(pkg)!r})
        code_ran.begin()
        wrapper, _ = module.patch_thing()
        wrapper(3)
        before = code_ran.report()
        spec = importlib.util.spec_from_file_location("plain_import", {str(pkg / "unprobed.py")!r})
        m = importlib.util.module_from_spec(spec); sys.modules["plain_import"] = m; spec.loader.exec_module(m)
        report = code_ran.report()
        roots = [f.root for f in sys.meta_path if isinstance(f, code_ran._Finder)]
        same = code_ran._unprobed_under(roots) is code_ran._unprobed_under(roots)  # nothing imported in between
        del sys.modules["plain_import"]
        print(json.dumps([before, report, code_ran.report(), same]))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    import json

    before, report, after, same = json.loads(res.stdout.strip().splitlines()[-1])
    # the scan of imported modules is read again once sys.modules changed, and only then
    assert "unprobed.py" not in before and "unprobed.py" not in after and same
    # Helper.method never ran
    assert set(report) == {"__init__.py::<module>", "impl.py::<module>", "impl.py::patch_thing",
                           "impl.py::patch_thing.wrapper", "unprobed.py"}
    index = code_ran.CodeIndex(pkg)
    assert index.unchanged(report)
    (pkg / "impl.py").write_text(SOURCE.replace("return 2", "return 3"))  # a function that did not run
    assert code_ran.CodeIndex(pkg).unchanged(report)
    (pkg / "impl.py").write_text(SOURCE.replace("x * scale", "x * scale + 0"))  # one that ran
    assert not code_ran.CodeIndex(pkg).unchanged(report)
    (pkg / "impl.py").write_text(SOURCE)
    (pkg / "unprobed.py").write_text("VALUE = 3  # edited\n")  # imported without probes: its bytes count
    assert not code_ran.CodeIndex(pkg).unchanged(report)


def test_the_probes_leave_docstrings_tracebacks_and_the_bytecode_cache_alone(tmp_path):
    pkg = _module(tmp_path, SOURCE + "\n\ndef fails():\n    raise ValueError('here')\n")
    script = textwrap.dedent(f"""
        import sys, traceback
        sys.path.insert(0, {str(ROOT)!r})
        from harness.undertest.install import load_patches_module
        module = load_patches_module({str(pkg)!r})
        impl = sys.modules[module.__name__ + ".impl"]
        assert impl.__doc__ == "a patches module"
        assert impl.patch_thing.__doc__ == "installs" and impl.Helper.method.__doc__ is None
        try:
            impl.fails()
        except ValueError:
            line = traceback.extract_tb(sys.exc_info()[2])[-1]
            print(line.lineno, line.line)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    expected_line = (SOURCE + "\n\ndef fails():\n    raise ValueError('here')\n").splitlines().index(
        "    raise ValueError('here')") + 1
    assert res.stdout.split()[:1] == [str(expected_line)] and "raise ValueError('here')" in res.stdout
    assert not list(pkg.rglob("*.pyc"))


def test_ranks_that_hashed_a_piece_differently_match_no_source():
    merged = code_ran.merge([{"a.py::f": "1", "a.py::<module>": "m"}, {"a.py::f": "2"}, None])
    assert merged == {"a.py::<module>": "m", "a.py::f": "?"}


def test_a_modules_real_path_is_resolved_as_pathlib_does_through_linked_folders_and_files(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "pkg").mkdir(parents=True)
    (real / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "linkdir").symlink_to(real)
    (real / "pkg" / "b.py").symlink_to(tmp_path / "elsewhere.py")
    (tmp_path / "elsewhere.py").write_text("y = 2\n")
    monkeypatch.chdir(real)
    for name in [real / "pkg" / "a.py", tmp_path / "linkdir" / "pkg" / "a.py", tmp_path / "linkdir" / "pkg" / "b.py",
                 Path("pkg/a.py"), tmp_path / "linkdir" / "pkg" / ".." / "pkg" / "a.py"]:
        assert code_ran._located(str(name), [])[0] == str(Path(name).resolve()), name
    module = types.ModuleType("m")
    module.__file__ = str(tmp_path / "linkdir" / "pkg" / "a.py")
    assert code_ran._file_under(module, [(real / "pkg").resolve()]) == ((real / "pkg" / "a.py"), "a.py")
    module.__file__ = str(tmp_path / "linkdir" / "pkg" / "b.py")  # a link out of the root: not under it
    assert code_ran._file_under(module, [(real / "pkg").resolve()]) is None
