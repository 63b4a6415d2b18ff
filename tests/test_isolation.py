"""Patch sets are undone between cells of one launch (run in a subprocess: patches are global)."""

import subprocess
import sys
import textwrap

from tests.support import ROOT


def test_snapshot_restores_torch_and_reinstall_is_fresh():
    script = textwrap.dedent('''
        import importlib, sys
        from harness.undertest.undo import PatchUndo, forget_module
        assert "torch.distributed.fsdp._fully_shard._fsdp_param" not in sys.modules  # snapshot must load it
        snap0 = PatchUndo.take()
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
        from harness.undertest.install import install_patches, load_patches_module

        names = ["unused_param_reduction", "uniform_reduce_dtype", "accumulated_grad_guard",
                 "restore_unused_param_grads"]
        original = (_fsdp_param_group.FSDPParamGroup.post_backward, _fsdp_collectives.foreach_reduce)
        for round in range(2):
            snap = PatchUndo.take()
            forget_module("fsdp_patches")
            outcomes = install_patches(load_patches_module("fsdp_patches"), names)
            statuses = sorted({o.status for o in outcomes.values()})
            assert "already-installed" not in statuses, (round, outcomes)
            assert "error" not in statuses, outcomes
            changed = snap.changes()
            assert any("foreach_reduce" in c for c in changed), changed
            snap.restore()
            assert snap.changes() == [], snap.changes()
            assert (_fsdp_param_group.FSDPParamGroup.post_backward, _fsdp_collectives.foreach_reduce) == original
        print("ok", len(changed))
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok")
