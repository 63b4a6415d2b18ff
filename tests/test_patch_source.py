"""The patches module under test is read, not run, by the harness process."""

import subprocess
import sys

import pytest

from harness.undertest.source import check_patch_names, locate
from tests.support import ROOT


def test_own_module_names_version_and_hash():
    src = locate("fsdp_patches")
    assert {"unused_param_reduction", "uniform_reduce_dtype", "accumulated_grad_guard",
            "restore_unused_param_grads", "clip_grad_norm", "scale_grads"} <= src.patches
    assert len(src.sha256) == 64 and src.path.name == "fsdp_patches"


def test_file_and_folder_modules(tmp_path):
    (tmp_path / "mine.py").write_text("__version__ = '1.2'\ndef patch_fsdp_x():\n    pass\ndef clip_grad_norm_():\n    pass\n")
    src = locate(str(tmp_path / "mine.py"))
    assert src.patches == {"x", "clip_grad_norm"} and src.version == "1.2"
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .impl import patch_y\n")
    (pkg / "impl.py").write_text("def patch_y():\n    pass\n")
    assert locate(str(pkg)).patches == {"y"} and len(locate(str(pkg)).files) == 2
    (pkg / "impl.py").write_text("def patch_y():\n    return 1\n")
    assert locate(str(pkg)).sha256 != src.sha256


def test_the_description_names_module_version_and_hash_never_a_folder(tmp_path):
    own = locate("fsdp_patches")
    assert own.describe() == f"fsdp_patches{' ' + own.version if own.version else ''} (sha256 {own.sha256[:12]})"
    (tmp_path / "mine.py").write_text("__version__ = '1.2'\ndef patch_fsdp_x():\n    pass\n")
    file = locate(str(tmp_path / "mine.py"))
    assert file.describe() == f"mine.py 1.2 (sha256 {file.sha256[:12]})"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("def patch_y():\n    pass\n")
    folder = locate(str(tmp_path / "pkg") + "/")
    assert folder.describe() == f"pkg (sha256 {folder.sha256[:12]})"
    assert str(tmp_path) not in file.describe() + folder.describe() + own.describe()
    assert "/" not in file.describe() + folder.describe() + own.describe()


def test_a_typo_is_named_with_a_suggestion():
    own = locate("fsdp_patches")
    with pytest.raises(ValueError, match=r"scenario 's' names unknown patch 'unused_param_reductoin' "
                                         r"\(did you mean 'unused_param_reduction'\?\)"):
        check_patch_names({"s": ["unused_param_reductoin"]}, [own], {})
    check_patch_names({"s": ["unused_param_reduction", "mine"]}, [own], {"mine": "patch_other"})


def test_cli_stops_on_a_typo_in_one_line(tmp_path):
    (tmp_path / "typo.py").write_text(
        "import torch\nfrom harness.spec import Scenario\nfrom scenarios._models import MLP, randn_batch\n"
        "SCENARIO = Scenario(model=MLP, batch=randn_batch(), patches=('uniform_reduce_dtyp',))\n")
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--scenarios-dir", str(tmp_path),
                          "--scenario", "typo"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: scenario 'typo' names unknown patch 'uniform_reduce_dtyp' "
                                  "(did you mean 'uniform_reduce_dtype'?)")


def test_a_misspelt_function_in_the_module_is_warned_about(tmp_path):
    from harness.undertest.source import near_misses

    module = tmp_path / "third.py"
    module.write_text("def patch_fsdp_unused_param_reductoin():\n    pass\n\n"
                      "def patch_fsdp_my_own_fix():\n    pass\n\n"
                      "def patch_fsdp_uniform_reduce_dtype():\n    pass\n")
    vocabulary = ("unused_param_reduction", "uniform_reduce_dtype", "restore_unused_param_grads")
    (warning,) = near_misses(locate(str(module)), vocabulary, {})
    assert "patch_fsdp_unused_param_reductoin looks like a misspelling of patch 'unused_param_reduction'" in warning
    # mapped, it is no longer a miss; a module's own extra patch never is
    assert near_misses(locate(str(module)), vocabulary,
                       {"unused_param_reduction": "patch_fsdp_unused_param_reductoin"}) == []
