"""harness.plan.installed: the content of the installed files in every cell's key, so an edit of an
installed package under the same version (a torch file patched by hand) reruns the cells."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from harness.plan import installed
from harness.plan.installed import content_digest


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "site-packages"
    (root / "torch" / "distributed").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("version = 1\n")
    (root / "torch" / "distributed" / "fsdp.py").write_text("def reduce():\n    return 'sum'\n")
    (root / "torch" / "lib").mkdir()
    (root / "torch" / "lib" / "libtorch.so").write_bytes(b"\x7fELF" + bytes(64))
    return root


@pytest.fixture
def hashed(monkeypatch):
    """The paths ``content_digest`` read, call by call."""
    seen: list[str] = []
    real = installed._file_digest

    def counting(path: str) -> str:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(installed, "_file_digest", counting)
    return seen


def test_an_edit_under_the_same_size_and_time_changes_the_digest(site, tmp_path, hashed):
    cache = tmp_path / "cache.json"
    first = content_digest([site], cache)
    assert len(hashed) == 3 and json.loads(cache.read_text())["files"]
    hashed.clear()
    assert content_digest([site], cache) == first and hashed == []  # nothing moved: nothing read
    target = site / "torch" / "distributed" / "fsdp.py"
    st = target.stat()
    target.write_text("def reduce():\n    return 'avg'\n")  # the same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the modification time put back
    edited = content_digest([site], cache)
    assert edited != first and hashed == [str(target)]
    target.write_text("def reduce():\n    return 'sum'\n")
    assert content_digest([site], cache) == first  # the same content again: the same key


def test_a_touch_or_a_reinstall_of_the_same_content_keeps_the_digest(site, tmp_path, hashed):
    cache = tmp_path / "cache.json"
    first = content_digest([site], cache)
    lib = site / "torch" / "lib" / "libtorch.so"
    os.utime(lib, ns=(1, 1))
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)
    hashed.clear()
    assert content_digest([site], cache) == first and hashed == [str(lib)]


def test_bytecode_and_package_metadata_are_left_out_and_files_added_or_removed_count(site, tmp_path):
    cache = tmp_path / "cache.json"
    first = content_digest([site], cache)
    (site / "torch" / "__pycache__").mkdir()
    (site / "torch" / "__pycache__" / "fsdp.cpython-311.pyc").write_bytes(b"bytecode")
    (site / "torch-2.13.0.dist-info").mkdir()
    (site / "torch-2.13.0.dist-info" / "RECORD").write_text("rewritten by every reinstall\n")
    assert content_digest([site], cache) == first
    (site / "torch" / "extra.py").write_text("x = 1\n")
    added = content_digest([site], cache)
    assert added != first
    (site / "torch" / "extra.py").unlink()
    assert content_digest([site], cache) == first
    assert content_digest([site], None) == first  # no cache: every file read, the same digest


def test_the_module_under_test_installed_there_is_left_to_its_own_key(site, tmp_path):
    """A patches module installed in site-packages is keyed by the code of it each cell ran
    (``harness.undertest.code_ran``): an edit of it must not rerun every cell, vanilla ones included."""
    module = site / "mypatches"
    module.mkdir()
    (module / "__init__.py").write_text("def patch_fsdp_x():\n    pass\n")
    (site / "mypatches_extra.py").write_text("y = 1\n")
    cache, leave = tmp_path / "cache.json", (str(module), str(site / "mypatches_extra.py"))
    first = content_digest([site], cache, leave)
    (module / "__init__.py").write_text("def patch_fsdp_x():\n    return 1\n")
    (site / "mypatches_extra.py").write_text("y = 2\n")
    assert content_digest([site], cache, leave) == first
    (site / "torch" / "__init__.py").write_text("version = 2\n")
    assert content_digest([site], cache, leave) != first


def test_a_cache_that_cannot_be_written_costs_only_time(site, tmp_path, hashed):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder would go\n")
    cache = blocker / "cache.json"
    first = content_digest([site], cache)
    assert first == content_digest([site], None)
    assert len(hashed) == 6 and list(tmp_path.glob("**/*.tmp")) == []


def test_torchs_folder_counts_where_it_lies_outside_site_packages(tmp_path, monkeypatch):
    checkout = tmp_path / "pytorch" / "torch"
    checkout.mkdir(parents=True)
    found = SimpleNamespace(submodule_search_locations=[str(checkout)])
    monkeypatch.setattr(installed.importlib.util, "find_spec", lambda name: found if name == "torch" else None)
    roots = installed.installed_roots()
    assert roots[-1] == checkout.resolve() and len(roots) == len(set(roots))
    inside = roots[0] / "torch"
    monkeypatch.setattr(installed.importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(inside)]))
    assert checkout.resolve() not in installed.installed_roots() and inside not in installed.installed_roots()


def test_every_cells_key_and_the_saved_plans_key_follow_the_installed_code(monkeypatch):
    from harness.plan import inputs, saved
    from harness.plan.cells import Cell
    from harness.runconfig import RunConfig
    from harness.undertest.source import locate

    cell = Cell(index=0, scenario="plain", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=30)
    keys = []
    for code in ("before", "after"):
        monkeypatch.setattr(inputs, "installed_code", lambda leave_out=(), code=code: code)
        monkeypatch.setattr(saved, "installed_code", lambda leave_out=(), code=code: code)
        cells = inputs.CellInputs(scenario_files={}, source=locate("fsdp_patches"))
        keys.append((cells.key(cell), cells.reference_inputs(cell), saved.plan_key(RunConfig())))
    assert all(a != b for a, b in zip(*keys)), keys  # the cell's key, its reference's, the plan's
