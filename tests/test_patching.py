import textwrap

import pytest

from harness.undertest.install import install_patches, load_patches_module, resolve


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "third_party_patches.py"
    path.write_text(textwrap.dedent('''
        from types import SimpleNamespace
        CALLS = []
        def patch_fsdp_good():
            CALLS.append("good")
        def patch_fine():
            return SimpleNamespace(status="not-applicable", reason="fixed upstream")
        def patch_fsdp_explodes():
            raise RuntimeError("cannot find FSDPParamGroup.post_backward\\nmore")
        def clip_grad_norm_(params, max_norm, norm_type=2.0, foreach=None):
            return 0.0
    '''))
    return load_patches_module(str(path))


def test_outcomes_installed_not_applicable_error_missing(module):
    out = install_patches(module, ["good", "fine", "explodes", "absent", "clip_grad_norm"])
    assert out["good"].status == "installed" and module.CALLS == ["good"]
    assert (out["fine"].status, out["fine"].reason) == ("not-applicable", "fixed upstream")
    assert out["explodes"].status == "error"
    assert out["explodes"].reason == "RuntimeError: cannot find FSDPParamGroup.post_backward"
    assert out["absent"].status == "not-provided"
    assert out["absent"].reason == f"{module.__name__} has no patch_fsdp_absent or patch_absent"
    assert out["clip_grad_norm"].status == "installed"


def test_a_missing_function_does_not_stop_the_others_and_names_the_file(module, tmp_path):
    label = str(tmp_path / "third_party_patches.py")
    out = install_patches(module, ["absent", "good"], label=label)
    assert out["absent"].status == "not-provided" and out["absent"].reason.startswith(f"{label} has no ")
    assert out["good"].status == "installed"
    mapped = install_patches(module, ["good2"], {"good2": "patch_typo"}, label=label)
    assert mapped["good2"].status == "error"  # a mapping that names a missing function is a mistake
    assert mapped["good2"].reason == f"patch target missing: {label} has no patch_typo (mapped from good2)"


def test_mapping_overrides_lookup(module):
    assert resolve(module, "whatever", {"whatever": "patch_fine"}) is module.patch_fine


def test_bad_module_specs_give_one_line(tmp_path):
    with pytest.raises(ValueError, match="cannot be imported"):
        load_patches_module("no_such_patches_module")
    with pytest.raises(ValueError, match="not found"):
        load_patches_module(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('needs torch 3')\n")
    with pytest.raises(ValueError, match="failed to import: ImportError: needs torch 3"):
        load_patches_module(str(broken))


def test_a_module_that_exits_at_import_is_named_as_such(tmp_path):
    """``sys.exit(0)`` at import is not a message "0": it says the module exited, and how."""
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(ValueError) as err:
        load_patches_module(str(quits))
    assert str(err.value) == "patches module exited at import (SystemExit 0)"


def test_a_patch_that_exits_at_install_is_an_install_error_and_the_others_install(tmp_path):
    path = tmp_path / "exiting_patches.py"
    path.write_text("import sys\ndef patch_quits():\n    sys.exit(3)\ndef patch_fsdp_good():\n    pass\n")
    stamped = []
    out = install_patches(load_patches_module(str(path)), ["quits", "good"], on_patch=stamped.append)
    assert (out["quits"].status, out["quits"].reason) == ("error", "patch_quits exited at install (SystemExit 3)")
    assert out["good"].status == "installed"
    assert stamped == ["quits", "good"]  # each install announced before it runs (the rank's phase)
