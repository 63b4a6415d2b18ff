"""fsdp_patches on real FSDP2 runs (world size 1, gloo, FileStore, torch 2.13 CPU).

One subprocess (so the pytest process stays unpatched) trains a tiny model through the
bug cases B2 (mixed grad dtypes under accumulation), C (a unit that never ran forward)
and E (a parameter no rank used), in phases:

* vanilla, then ``apply_all()``, then ``undo_all()``: torch's objects are back (``is``)
  and the bugs are vanilla again;
* another library's counting wrapper on every patch target *before* ``apply_all()``,
  and one *after* it: both wrappers run and the bugs stay fixed; after ``undo_all()``
  the foreign wrappers still run and the bugs are back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent(
    """
    import datetime, functools, json, os, sys
    import torch, torch.nn as nn
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    import fsdp_patches
    from fsdp_patches._compat import fsdp_internal_module, fsdp_param_class, fsdp_param_group_class

    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    MP = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    GROUP, PARAM = fsdp_param_group_class(), fsdp_param_class()
    TARGETS = {
        "foreach_reduce": (fsdp_internal_module("_fsdp_param_group"), "foreach_reduce"),
        "post_backward": (GROUP, "post_backward"),
        "__init__": (GROUP, "__init__"),
        "to_accumulated_grad_if_needed": (PARAM, "to_accumulated_grad_if_needed"),
    }
    TARGETS = {k: (o, a) for k, (o, a) in TARGETS.items() if a in vars(o)}  # 2.15: no C method
    ORIGINALS = {k: vars(o)[a] for k, (o, a) in TARGETS.items()}
    CALLS = {k: 0 for k in TARGETS}

    def wrap_foreign():
        for key, (owner, attr) in TARGETS.items():
            inner = vars(owner)[attr]
            @functools.wraps(inner)
            def foreign(*args, _inner=inner, _key=key, **kwargs):
                CALLS[_key] += 1
                return _inner(*args, **kwargs)
            setattr(owner, attr, foreign)

    def remove_foreign():
        for key, (owner, attr) in TARGETS.items():
            setattr(owner, attr, ORIGINALS[key])

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, use_unused):
            h = self.used(x)
            return (self.unused(h) if use_unused else h).float().square().mean()

    def run(case):
        torch.manual_seed(0)
        model = Net()
        mp = MixedPrecisionPolicy() if case == "E" else MP
        if case == "C":
            fully_shard(model.unused, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        if case == "E" and hasattr(model, "set_reduce_scatter_unused_params"):
            model.set_reduce_scatter_unused_params(True)
        try:
            for micro_batch, use_unused in enumerate([False, case == "B2"]):
                model.set_requires_gradient_sync(micro_batch == 1)
                model(torch.randn(4, 8), use_unused).backward()
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        return {
            "error": None,
            "grads": {n: None if p.grad is None else str(p.grad.dtype)
                      for n, p in model.named_parameters()},
        }

    def runs(tag):
        for key in CALLS:
            CALLS[key] = 0
        out[tag] = {c: run(c) for c in ("B2", "C", "E")}
        out[tag]["calls"] = dict(CALLS)

    def originals_back():
        return {k: vars(o)[a] is ORIGINALS[k] for k, (o, a) in TARGETS.items()}

    out = {}
    runs("vanilla")
    out["install"] = {k: v.status for k, v in fsdp_patches.apply_all().items()}
    runs("patched")
    out["undo"] = fsdp_patches.undo_all()
    out["originals_back"] = originals_back()
    runs("undone")

    wrap_foreign()
    out["install_over_foreign"] = {k: v.status for k, v in fsdp_patches.apply_all().items()}
    runs("foreign_first")
    fsdp_patches.undo_all()
    runs("foreign_first_undone")
    remove_foreign()

    fsdp_patches.apply_all()
    wrap_foreign()
    out["install_under_foreign"] = {k: v.status for k, v in fsdp_patches.apply_all().items()}
    runs("foreign_on_top")
    out["undo_under_foreign"] = fsdp_patches.undo_all()
    runs("foreign_on_top_undone")
    out["reinstall_under_foreign"] = {k: v.status for k, v in fsdp_patches.apply_all().items()}
    runs("foreign_on_top_reinstalled")
    print("RESULT" + json.dumps(out))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
    """
)

FIXED = ("patched", "foreign_first", "foreign_on_top", "foreign_on_top_reinstalled")
UNDONE = ("undone", "foreign_first_undone", "foreign_on_top_undone")
FOREIGN = ("foreign_first", "foreign_first_undone", "foreign_on_top", "foreign_on_top_undone",
           "foreign_on_top_reinstalled")


@pytest.fixture(scope="module")
def ws1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("store") / "filestore"
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(store)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT") :])


def _applies(ws1: dict[str, Any], patch: str) -> bool:
    return ws1["install"][patch] == "installed"


def test_install_statuses(ws1: dict[str, Any]) -> None:
    for key in ("install_over_foreign", "reinstall_under_foreign"):
        assert ws1[key] == ws1["install"], key  # foreign wrappers do not hide the targets
    assert set(ws1["install_under_foreign"].values()) <= {"already-installed", "not-applicable"}
    assert ws1["originals_back"] == dict.fromkeys(ws1["originals_back"], True)
    assert all(line.endswith(": restored") for lines in ws1["undo"].values() for line in lines)
    passes = [line for lines in ws1["undo_under_foreign"].values() for line in lines if "passes through" in line]
    assert passes  # every patched target held a foreign wrapper over ours


def test_mixed_dtype_fixed_undone_and_beside_foreign_wrappers(ws1: dict[str, Any]) -> None:
    if not _applies(ws1, "uniform_reduce_dtype"):
        pytest.skip("bug B fixed natively in this torch")
    vanilla = ws1["vanilla"]["B2"]["error"]
    assert vanilla is not None and vanilla.startswith("AssertionError")
    assert "expects uniform gradient dtype" in vanilla
    for phase in FIXED:
        assert ws1[phase]["B2"]["error"] is None, phase
        assert set(ws1[phase]["B2"]["grads"].values()) == {"torch.float32"}, phase
    for phase in UNDONE:
        assert ws1[phase]["B2"]["error"] == vanilla, phase


def test_skipped_unit_fixed_undone_and_beside_foreign_wrappers(ws1: dict[str, Any]) -> None:
    if not _applies(ws1, "accumulated_grad_guard"):
        pytest.skip("bug C fixed natively in this torch")
    vanilla = ws1["vanilla"]["C"]["error"]
    assert vanilla == "AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'"
    for phase in FIXED:
        assert ws1[phase]["C"]["error"] is None, phase
        assert ws1[phase]["C"]["grads"]["unused.weight"] is None, phase
        assert ws1[phase]["C"]["grads"]["used.weight"] == "torch.float32", phase
    for phase in UNDONE:
        assert ws1[phase]["C"]["error"] == vanilla, phase


def test_globally_unused_param_fixed_undone_and_beside_foreign_wrappers(ws1: dict[str, Any]) -> None:
    vanilla = ws1["vanilla"]["E"]
    if vanilla["error"] is not None or vanilla["grads"]["unused.weight"] is None:
        pytest.skip("needs the public set_reduce_scatter_unused_params (a zero grad in vanilla)")
    assert vanilla["grads"]["unused.weight"] == "torch.float32"  # a zero grad, not None
    for phase in FIXED:
        assert ws1[phase]["E"]["error"] is None, phase
        assert ws1[phase]["E"]["grads"]["unused.weight"] is None, phase
        assert ws1[phase]["E"]["grads"]["used.weight"] == "torch.float32", phase
    for phase in UNDONE:
        assert ws1[phase]["E"] == vanilla, phase


def test_foreign_wrappers_run_in_both_orders(ws1: dict[str, Any]) -> None:
    assert set(ws1["vanilla"]["calls"].values()) == {0}
    for phase in FOREIGN:
        calls = ws1[phase]["calls"]
        assert all(n > 0 for n in calls.values()), (phase, calls)
