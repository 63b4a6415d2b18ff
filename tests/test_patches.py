"""Fast tests of fsdp_patches (torch 2.13 CPU, single process).

Installs are process-global, so every test that installs runs under the
``pristine_targets`` fixture: it checks that no wrapper of ours is present on entry (a
leak from an earlier test fails here) and registers every patch target with pytest's
``monkeypatch`` so the untouched torch objects come back afterwards. Real FSDP2 runs
(world size 1, gloo, FileStore) happen in one subprocess so this process stays unpatched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import fsdp_patches
from fsdp_patches import PATCHES, PatchResult, apply_all
from fsdp_patches._compat import (
    PATCH_MARKER,
    foreach_reduce_aliases,
    fsdp_internal_module,
    fsdp_module_class,
    fsdp_param_class,
    fsdp_param_group_class,
    original_of,
)
from fsdp_patches.accumulated_grad import is_missing_unsharded_param_error, make_accumulated_grad_guard
from fsdp_patches.reduce_dtype import _make_widening_wrapper, widen_float_grads_, widest_float_dtype

REPO = Path(__file__).resolve().parents[1]
GROUP = fsdp_param_group_class()
PARAM = fsdp_param_class()
MODULE = fsdp_module_class()
COLLECTIVES = fsdp_internal_module("_fsdp_collectives")
HAS_PUBLIC_SETTER = hasattr(MODULE, "set_reduce_scatter_unused_params")


def _targets() -> list[tuple[Any, str]]:
    targets: list[tuple[Any, str]] = [
        (GROUP, "__init__"),
        (GROUP, "post_backward"),
        (PARAM, "to_accumulated_grad_if_needed"),
        (MODULE, "set_reduce_scatter_unused_params"),
    ]
    return targets + foreach_reduce_aliases()


def _own(owner: Any, name: str) -> Any:
    return vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)


@pytest.fixture
def pristine_targets(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for owner, name in _targets():
        value = _own(owner, name)
        if value is None:
            continue
        assert getattr(value, PATCH_MARKER, None) is None, f"leaked wrapper on {owner}.{name}"
        monkeypatch.setattr(owner, name, value)
    return monkeypatch


# --------------------------------------------------------------------- API shape


def test_public_api() -> None:
    assert set(PATCHES) == {
        "unused_param_reduction",
        "uniform_reduce_dtype",
        "accumulated_grad_guard",
        "restore_unused_param_grads",
    }
    for name in fsdp_patches.__all__:
        assert hasattr(fsdp_patches, name)
    for name in ("clip_grad_norm_", "get_total_grad_norm", "scale_grads_"):
        assert callable(getattr(fsdp_patches, name))
    result = PatchResult(name="x", status="installed", reason="r")
    with pytest.raises(Exception):
        result.status = "other"  # type: ignore[misc]


# ------------------------------------------------------------------ idempotence


def _wrapped_attr(short: str) -> tuple[Any, str]:
    if short == "unused_param_reduction":
        return (GROUP, "__init__") if HAS_PUBLIC_SETTER else (GROUP, "post_backward")
    if short == "uniform_reduce_dtype":
        return COLLECTIVES, "foreach_reduce"
    if short == "accumulated_grad_guard":
        return PARAM, "to_accumulated_grad_if_needed"
    return GROUP, "post_backward"


@pytest.mark.parametrize("short", list(PATCHES))
def test_install_twice_leaves_one_wrapper(short: str, pristine_targets: pytest.MonkeyPatch) -> None:
    owner, attr = _wrapped_attr(short)
    original = _own(owner, attr)
    first = PATCHES[short]()
    wrapper = _own(owner, attr)
    second = PATCHES[short]()
    assert (first.status, second.status) == ("installed", "already-installed")
    assert first.name == second.name == short
    assert _own(owner, attr) is wrapper
    assert getattr(wrapper, PATCH_MARKER) == short
    assert wrapper.__wrapped__ is original
    assert getattr(original, PATCH_MARKER, None) is None


def test_foreach_reduce_wrapped_in_every_alias(pristine_targets: pytest.MonkeyPatch) -> None:
    aliases = foreach_reduce_aliases()
    modules = {m.__name__.rsplit(".", 1)[-1] for m, _ in aliases}
    assert {"_fsdp_collectives", "_fsdp_param_group"} <= modules
    original = COLLECTIVES.foreach_reduce
    fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    wrappers = {id(getattr(m, a)) for m, a in aliases}
    assert len(wrappers) == 1
    assert all(getattr(m, a).__wrapped__ is original for m, a in aliases)


def test_apply_all_twice(pristine_targets: pytest.MonkeyPatch) -> None:
    first = apply_all()
    second = apply_all()
    assert list(first) == list(PATCHES)
    assert all(r.status in ("installed", "not-applicable") for r in first.values()), first
    for name, result in first.items():
        expected = "already-installed" if result.status == "installed" else "not-applicable"
        assert second[name].status == expected, second


def test_fallback_zero_fill_composes_with_restore(pristine_targets: pytest.MonkeyPatch) -> None:
    """Without the public setter (torch < 2.13) A and E both wrap post_backward, once each."""
    original = vars(GROUP)["post_backward"]
    pristine_targets.delattr(MODULE, "set_reduce_scatter_unused_params", raising=False)
    results = [
        fsdp_patches.patch_fsdp_restore_unused_param_grads(),
        fsdp_patches.patch_fsdp_unused_param_reduction(),
        fsdp_patches.patch_fsdp_unused_param_reduction(),
        fsdp_patches.patch_fsdp_restore_unused_param_grads(),
    ]
    assert [r.status for r in results] == ["installed", "installed", "already-installed", "already-installed"]
    assert "zero-fill" in results[1].reason
    outer = GROUP.post_backward
    markers = []
    link = outer
    while getattr(link, PATCH_MARKER, None) is not None:
        markers.append(getattr(link, PATCH_MARKER))
        link = link.__wrapped__
    assert markers == ["unused_param_reduction", "restore_unused_param_grads"]
    assert link is original and original_of(outer) is original


# --------------------------------------------------------------- not-applicable


def test_unused_param_reduction_not_applicable(pristine_targets: pytest.MonkeyPatch) -> None:
    pristine_targets.delattr(MODULE, "set_reduce_scatter_unused_params", raising=False)
    pristine_targets.delattr(GROUP, "post_backward")
    result = fsdp_patches.patch_fsdp_unused_param_reduction()
    assert result.status == "not-applicable" and "post_backward" in result.reason


def test_uniform_reduce_dtype_not_applicable_without_target(pristine_targets: pytest.MonkeyPatch) -> None:
    pristine_targets.delattr(COLLECTIVES, "foreach_reduce")
    result = fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    assert result.status == "not-applicable" and "foreach_reduce" in result.reason


def test_uniform_reduce_dtype_not_applicable_when_fixed(pristine_targets: pytest.MonkeyPatch) -> None:
    """A foreach_reduce without the uniform-dtype assertion (as in 2.15) is left alone."""

    def foreach_reduce(fsdp_params: list[Any], unsharded_grads: list[torch.Tensor]) -> None:
        return None

    for module, attr in foreach_reduce_aliases():
        pristine_targets.setattr(module, attr, foreach_reduce)
    result = fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    assert result.status == "not-applicable" and "natively" in result.reason
    assert COLLECTIVES.foreach_reduce is foreach_reduce


def test_accumulated_grad_guard_not_applicable(pristine_targets: pytest.MonkeyPatch) -> None:
    pristine_targets.delattr(PARAM, "to_accumulated_grad_if_needed")
    result = fsdp_patches.patch_fsdp_accumulated_grad_guard()
    assert result.status == "not-applicable"
    assert not hasattr(PARAM, "to_accumulated_grad_if_needed")


def test_restore_unused_param_grads_not_applicable(pristine_targets: pytest.MonkeyPatch) -> None:
    pristine_targets.delattr(GROUP, "post_backward")
    result = fsdp_patches.patch_fsdp_restore_unused_param_grads()
    assert result.status == "not-applicable"
    assert not hasattr(GROUP, "post_backward")


# ------------------------------------------------------------------- widening


@pytest.mark.parametrize(
    ("dtypes", "expected"),
    [
        ({torch.bfloat16, torch.float32}, torch.float32),
        ({torch.bfloat16, torch.float16}, torch.float32),
        ({torch.float32}, None),
        ({torch.float32, torch.int64}, None),
        (set(), None),
    ],
)
def test_widest_float_dtype(dtypes: set[torch.dtype], expected: torch.dtype | None) -> None:
    assert widest_float_dtype(dtypes) == expected


def test_widen_float_grads_in_place() -> None:
    grads = [torch.ones(2, dtype=torch.bfloat16), torch.full((3,), 2.0)]
    assert widen_float_grads_(grads) == torch.float32
    assert [g.dtype for g in grads] == [torch.float32, torch.float32]
    mixed = [torch.ones(2), torch.ones(2, dtype=torch.int64)]
    assert widen_float_grads_(mixed) is None
    assert mixed[1].dtype == torch.int64


def test_widening_wrapper_passes_positional_and_keyword_grads() -> None:
    seen: list[set[torch.dtype]] = []

    def foreach_reduce(fsdp_params: list[Any], unsharded_grads: list[torch.Tensor], group: Any = None) -> str:
        seen.append({g.dtype for g in unsharded_grads})
        return "done"

    wrapper = _make_widening_wrapper(foreach_reduce)
    grads = [torch.ones(1, dtype=torch.bfloat16), torch.ones(1)]
    assert wrapper([], grads, None) == "done"
    assert wrapper([], unsharded_grads=[torch.ones(1, dtype=torch.bfloat16), torch.ones(1)]) == "done"
    assert wrapper([], [torch.ones(1), torch.ones(1, dtype=torch.int64)]) == "done"
    assert seen == [{torch.float32}, {torch.float32}, {torch.float32, torch.int64}]
    assert [g.dtype for g in grads] == [torch.float32, torch.float32]  # caller's list widened


# ---------------------------------------------------------------------- guard


class _FakeParam:
    def convert(self) -> None:
        self._unsharded_param.grad  # noqa: B018 - raises like torch's method

    def other(self) -> None:
        self._something_else  # noqa: B018

    def raise_runtime(self) -> None:
        raise RuntimeError("boom")


def test_guard_swallows_only_the_missing_attribute() -> None:
    guarded_convert = make_accumulated_grad_guard(_FakeParam.convert)
    assert guarded_convert(_FakeParam()) is None

    with pytest.raises(AttributeError, match="_something_else"):
        make_accumulated_grad_guard(_FakeParam.other)(_FakeParam())
    with pytest.raises(RuntimeError, match="boom"):
        make_accumulated_grad_guard(_FakeParam.raise_runtime)(_FakeParam())

    present = _FakeParam()
    present._unsharded_param = object()  # has the attribute, but no .grad
    with pytest.raises(AttributeError):
        guarded_convert(present)


def test_guard_predicate_checks_the_object() -> None:
    owner, stranger = _FakeParam(), _FakeParam()
    error = AttributeError("'FSDPParam' object has no attribute '_unsharded_param'")
    assert is_missing_unsharded_param_error(owner, error)
    foreign = AttributeError("x", name="_unsharded_param", obj=stranger)
    assert not is_missing_unsharded_param_error(owner, foreign)
    assert not is_missing_unsharded_param_error(owner, KeyError("_unsharded_param"))


# ------------------------------------------------- world size 1 FSDP2 runs (subprocess)

_SCRIPT = textwrap.dedent(
    """
    import datetime, json, os, sys
    import torch, torch.nn as nn
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    import fsdp_patches

    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    MP = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

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

    out = {f"vanilla-{c}": run(c) for c in ("B2", "C", "E")}
    out["install"] = {k: v.status for k, v in fsdp_patches.apply_all().items()}
    out.update({f"patched-{c}": run(c) for c in ("B2", "C", "E")})
    print("RESULT" + json.dumps(out))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def world_size_one(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("store") / "filestore"
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(store)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT") :])


def test_ws1_mixed_dtype_vanilla_fails_patched_passes(world_size_one: dict[str, Any]) -> None:
    if world_size_one["install"]["uniform_reduce_dtype"] == "not-applicable":
        pytest.skip("bug B fixed natively in this torch")
    vanilla = world_size_one["vanilla-B2"]["error"]
    assert vanilla is not None and "expects uniform gradient dtype" in vanilla
    assert vanilla.startswith("AssertionError")
    patched = world_size_one["patched-B2"]
    assert patched["error"] is None
    assert set(patched["grads"].values()) == {"torch.float32"}


def test_ws1_skipped_unit_vanilla_fails_patched_passes(world_size_one: dict[str, Any]) -> None:
    if world_size_one["install"]["accumulated_grad_guard"] == "not-applicable":
        pytest.skip("bug C fixed natively in this torch")
    vanilla = world_size_one["vanilla-C"]["error"]
    assert vanilla == "AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'"
    patched = world_size_one["patched-C"]
    assert patched["error"] is None
    assert patched["grads"]["unused.weight"] is None
    assert patched["grads"]["used.weight"] == "torch.float32"


@pytest.mark.skipif(not HAS_PUBLIC_SETTER, reason="needs the public set_reduce_scatter_unused_params")
def test_ws1_globally_unused_param_gets_none_grad(world_size_one: dict[str, Any]) -> None:
    vanilla = world_size_one["vanilla-E"]
    assert vanilla["error"] is None
    assert vanilla["grads"]["unused.weight"] == "torch.float32"  # a zero grad, not None
    patched = world_size_one["patched-E"]
    assert patched["error"] is None
    assert patched["grads"]["unused.weight"] is None
    assert patched["grads"]["used.weight"] == "torch.float32"
