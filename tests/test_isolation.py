"""No cell sees what an earlier cell or patch set changed: patch sets are undone between the
cells of one launch, and every change to torch a cell makes (hooks, configs, settings, wrapped
functions, child processes) is put back, or never reaches another cell (``--isolate fork``),
and named on the leaking cell's record."""

import subprocess
import sys
import textwrap

import pytest

from tests.support import ROOT


def test_an_added_callable_is_taken_out_unnamed_and_a_replaced_one_named():
    """transformers adds ``torch.nn.Module.smart_apply`` at a model's first init: torch never
    calls it, so it is put back without a caveat; a replaced torch function is named."""
    import torch

    from harness.rank.leaks import TorchAttributes

    snap = TorchAttributes.take()
    linear = torch.nn.functional.linear
    torch.nn.Module.smart_apply = lambda self, fn: fn(self)
    torch.nn.functional.linear = lambda *a, **kw: linear(*a, **kw) * 1.01
    try:
        assert "torch.nn.modules.module.Module.smart_apply" in snap.changes()
        assert snap.changes(added=False) == ["torch.nn.functional.linear"]
        assert snap.restore() == ["torch.nn.functional.linear"]
        assert not hasattr(torch.nn.Module, "smart_apply") and torch.nn.functional.linear is linear
        assert snap.changes() == []
    finally:
        torch.nn.functional.linear = linear
        if "smart_apply" in vars(torch.nn.Module):
            del torch.nn.Module.smart_apply


def test_a_sharding_rule_a_cell_registered_is_named_and_taken_out():
    """DTensor's op tables are containers: a strategy registered for an op (bug R's patch, or a
    stack's) is named on the record and taken out, and a replaced one put back."""
    import torch
    from torch.distributed.tensor import DTensor

    from harness.rank.registries import Registries

    prop = DTensor._op_dispatcher.sharding_propagator
    table = prop.op_strategy_funcs
    op, other = torch.ops.aten.alias.default, torch.ops.aten.detach.default
    had, own, before = table.get(op), table.get(other), Registries.take()
    table[op] = added = lambda schema: None
    table[other] = lambda schema: None
    try:
        assert before.changes() == ["left DTensor sharding rules changed (op_strategy_funcs: aten.alias.default, "
                                    "aten.detach.default)"]
        before.restore()
        assert table.get(other) is own and table.get(op) is had is not added and before.changes() == []
    finally:
        table[other] = own
        if had is not None:
            table[op] = had


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


def test_the_undo_snapshot_follows_new_modules_and_classes_and_skips_only_namespaces_left_alone():
    """``PatchUndo`` reuses its scan of ``sys.modules`` and of each module's classes while their dicts'
    version tags stand still, and compares only namespaces whose tag moved: a module or a class that
    appeared since must still be snapshotted, and every change named and put back. A take shares the
    last take's copy of a namespace whose tag stood still, and copies again one changed since."""
    script = textwrap.dedent('''
        import sys, types
        from harness.undertest.undo import PatchUndo
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group
        PatchUndo.take()
        mod = types.ModuleType("torch.distributed._fsdp_compat_probe")
        sys.modules[mod.__name__] = mod
        class Probe:
            x = 1
        class Late:
            y = 1
        Probe.__module__ = Late.__module__ = mod.__name__
        mod.Probe = Probe
        second = PatchUndo.take()  # a module that appeared since the last scan
        assert mod.__name__ in second.modules and any(k is Probe for k, _ in second.classes)
        mod.Late = Late
        snap = PatchUndo.take()  # a class that appeared in a module scanned before
        assert any(k is Late for k, _ in snap.classes)
        original = group.FSDPParamGroup.post_backward
        Probe.x, Late.y, mod.extra = 2, 2, 3
        group.FSDPParamGroup.post_backward = lambda self, *a: None
        print(sorted(snap.changes()))
        snap.restore()
        assert (Probe.x, Late.y, hasattr(mod, "extra")) == (1, 1, False)
        assert group.FSDPParamGroup.post_backward is original and snap.changes() == []
        Probe.x = 5  # changed after a take: the next take must copy it again, not share the last copy
        third = PatchUndo.take()
        assert dict(third.classes)[Probe]["x"] == 5
        assert third.modules["torch.distributed.device_mesh"] is snap.modules["torch.distributed.device_mesh"]
        Probe.x = 6
        third.restore()
        assert Probe.x == 5 and third.changes() == []
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == str(["FSDPParamGroup.post_backward", "Late.y", "Probe.x",
                                      "torch.distributed._fsdp_compat_probe.extra"])


LEAKS = ROOT / "tests" / "fixtures" / "leaks"
LEAKY_PATCHES = ROOT / "tests" / "fixtures" / "leaky_patches.py"
#: what each leaking cell's record names (tests/fixtures/leaks)
LEFT = {
    ("a_leak_state", "vanilla"): ["left the default dtype float64", "left deterministic algorithms on",
                                  "left 1 global module forward hook(s) registered (_global_forward_hooks)",
                                  "left default saved-tensor hooks in force (saved_tensors_hooks entered, never exited)",
                                  "left torch._dynamo.config changed: disable",
                                  "left 1 child process(es) running: sleep (ended)"],
    ("b_leak_linear", "vanilla"): ["left torch.nn.functional.linear replaced"],
}


def _leak_run(tmp_path, name, *extra):
    import json

    out = tmp_path / f"{name}.jsonl"
    args = [sys.executable, "-m", "harness", "run", "--quiet", "--out", str(out), "--scenarios-dir", str(LEAKS),
            "--patches", str(LEAKY_PATCHES), "--world-size", "1", "--variant", "vanilla", "--variant", "patched",
            *extra]
    for scenario in ("a_leak_state", "b_leak_linear", "c_patch_leaks", "z_probe"):
        args += ["--scenario", scenario]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return res, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("isolate", ["snapshot", "fork"])
def test_no_cell_sees_what_an_earlier_cell_or_patch_set_left_and_each_leak_is_named(tmp_path, isolate):
    """Scenario code and a patch set leave hooks, configs, settings, a child process and two
    wrapped torch functions behind; the probe that runs after them (one slot: the planned order
    runs vanilla first, then each patch set) sees none of it, and the leaking records name it."""
    res, records = _leak_run(tmp_path, isolate, "--isolate", isolate)
    assert res.returncode == 0, res.stdout + res.stderr
    order = [(r["scenario"], r["variant"]) for r in records]
    assert order.index(("c_patch_leaks", "patched")) < order.index(("z_probe", "patched"))
    assert order.index(("a_leak_state", "vanilla")) < order.index(("z_probe", "vanilla"))
    by = {(r["scenario"], r["variant"]): r for r in records}
    assert by[("z_probe", "vanilla")]["status"] == by[("z_probe", "patched")]["status"] == "pass"
    for key, left in LEFT.items():
        assert by[key]["left_state"] == left, key
    leaky = by[("c_patch_leaks", "patched")]
    assert leaky["patch_changes"] == ["torch.distributed.all_reduce", "torch.nn.functional.linear"]
    # the reference never ran under the wrapped linear: the cell is a mismatch, not a pass against itself
    assert leaky["status"] == "mismatch" and leaky["as_expected"]


@pytest.mark.slow
def test_a_shuffled_order_with_the_leaks_gives_the_same_verdicts(tmp_path):
    from harness.results.diff import diff_runs, load_side

    _, planned = _leak_run(tmp_path, "planned")
    res, shuffled = _leak_run(tmp_path, "shuffled", "--shuffle", "8")
    assert res.returncode == 0, res.stdout + res.stderr
    order = [(r["scenario"], r["variant"]) for r in shuffled]
    # seed 8: every leaking cell, the leaky patch set included, runs before both probes
    assert max(order.index(k) for k in (("c_patch_leaks", "patched"), ("a_leak_state", "vanilla"))) \
        < min(order.index(k) for k in (("z_probe", "vanilla"), ("z_probe", "patched"))), order
    diff = diff_runs(load_side(tmp_path / "planned.jsonl"), load_side(tmp_path / "shuffled.jsonl"))
    assert diff.verdict_changes == 0, diff.markdown()


def test_the_scan_skips_namespaces_by_version_tag_and_still_sees_every_change():
    """After a scan found torch as ``take()`` saw it, namespaces whose dict's version tag has
    not moved are skipped; a change made after that scan is seen and put back all the same."""
    import sys

    import torch
    import torch.nn.functional as F

    from harness import versiontags
    from harness.rank import leaks

    if sys.implementation.name == "cpython" and sys.version_info < (3, 14):
        assert versiontags.TAG_OFFSET is not None  # the fast path runs on the interpreters CI uses
    baseline = leaks.TorchAttributes.take()
    assert baseline.changes() == []  # a clean scan: every namespace's tag noted
    original = F.linear

    def wrapped(*args, **kwargs):
        return original(*args, **kwargs)

    try:
        F.linear = wrapped
        assert "torch.nn.functional.linear" in baseline.changes()
        assert baseline.restore() == ["torch.nn.functional.linear"] and F.linear is original
        del torch.nn.Linear.extra_repr
        assert baseline.changes() == ["torch.nn.modules.linear.Linear.extra_repr (removed)"]
        baseline.restore()
        assert "extra_repr" in vars(torch.nn.Linear) and baseline.changes() == []
    finally:
        F.linear = original
        baseline.restore()


def test_a_namespace_where_only_plain_values_moved_is_skipped_until_its_dict_changes_again():
    """A counter or cache torch fills is nothing to name: the scan notes the namespace's new
    version tag as clean instead of walking it key by key after every cell; a function
    replaced in it later is still found."""
    import torch.nn.functional as F

    from harness import versiontags
    from harness.rank import leaks

    if versiontags.TAG_OFFSET is None:
        pytest.skip("no dict version tags on this interpreter: every namespace is walked")
    baseline = leaks.TorchAttributes.take()
    index = next(i for i, (obj, _, _) in enumerate(baseline.held) if obj is F)
    original = F.linear
    try:
        F._fsdp_compat_counter = 3  # a plain value, as torch's own counters are
        assert baseline.changes() == [] and baseline.clean[index] == baseline.tags[index].value
        F.linear = lambda *args, **kwargs: original(*args, **kwargs)
        assert baseline.changes() == ["torch.nn.functional.linear"]
        assert baseline.clean[index] != baseline.tags[index].value  # something to name: walked again next time
    finally:
        F.linear = original
        vars(F).pop("_fsdp_compat_counter", None)
        baseline.restore()


def test_a_child_held_by_a_thread_threading_does_not_list_is_found():
    """A thread outside ``threading.enumerate()`` (one ``join()`` has let go of but the OS has
    not yet ended, or one started with ``_thread``) still holds its children: the scan reads
    every thread it has not seen before, so the child is found, and taken out afterwards."""
    import _thread
    import threading

    from harness.rank.leaks import _children

    before = _children()
    started: list[subprocess.Popen] = []
    hold, ready = threading.Lock(), threading.Event()
    hold.acquire()

    def start_and_hold():
        started.append(subprocess.Popen(["sleep", "30"]))
        ready.set()
        hold.acquire()

    _thread.start_new_thread(start_and_hold, ())
    try:
        assert ready.wait(10)
        assert _children() - before == {started[0].pid}
    finally:
        hold.release()
        for p in started:
            p.kill()
            p.wait()


def test_child_processes_are_found_whichever_thread_started_them():
    """The children scan reads the main thread's and every Python thread's children (not
    gloo's native threads): a process started from the main thread, from a live thread, and
    from a thread that has since ended (Linux hands it to the main thread) are all found."""
    import threading

    from harness.rank.leaks import _children

    before = _children()
    started: list[subprocess.Popen] = []
    release = threading.Event()

    def start_and_wait():
        started.append(subprocess.Popen(["sleep", "30"]))
        release.wait(10)

    live = threading.Thread(target=start_and_wait)
    ended = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "30"])))
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
        live.start()
        ended.start()
        ended.join()
        while len(started) < 3:
            threading.Event().wait(0.01)
        assert _children() - before == {p.pid for p in started}
    finally:
        release.set()
        live.join()
        for p in started:
            p.kill()
            p.wait()
    assert _children() == before
