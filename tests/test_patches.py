"""Fast tests of fsdp_patches' installs and undo (torch 2.13 CPU, one process, no FSDP run).

Installs are process-global, so every test that installs runs under ``pristine``: it
snapshots the torch FSDP modules and their classes, registers changes through pytest's
``monkeypatch``, and at the end calls ``undo_all()``, undoes the monkeypatches and
checks that nothing differs from the snapshot (so every test also checks that undo puts
torch's own objects back), then restores the snapshot whatever happened. Real FSDP2 runs
(vanilla, patched, undone, beside other code's wrappers) are in ``test_patches_ws1.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import fsdp_patches
from fsdp_patches import PATCHES, PatchResult, apply_all, undo_all
from fsdp_patches._compat import fsdp_internal_module, fsdp_module_class, fsdp_param_class, fsdp_param_group_class
from fsdp_patches._wrapping import PATCH_MARKER, active_wrapper_in_chain, make_wrapper, replace_attribute, undo_patch
from fsdp_patches.accumulated_grad import guard_missing_unsharded_param, is_missing_unsharded_param_error
from fsdp_patches.reduce_dtype import foreach_reduce_aliases, widen_float_grads_, widening, widest_float_dtype

GROUP = fsdp_param_group_class()
PARAM = fsdp_param_class()
MODULE = fsdp_module_class()
COLLECTIVES = fsdp_internal_module("_fsdp_collectives")
PARAM_GROUP_MODULE = fsdp_internal_module("_fsdp_param_group")
HAS_PUBLIC_SETTER = hasattr(MODULE, "set_reduce_scatter_unused_params")
FOUR = ("unused_param_reduction", "uniform_reduce_dtype", "accumulated_grad_guard", "restore_unused_param_grads")


def _snapshot() -> dict[Any, dict[str, Any]]:
    """The attributes of every imported torch FSDP module and of the classes they define."""
    snap: dict[Any, dict[str, Any]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch.distributed.fsdp"):
            continue
        snap[module] = dict(vars(module))
        for value in vars(module).values():
            if isinstance(value, type) and (value.__module__ or "").startswith("torch.distributed.fsdp"):
                snap[value] = dict(vars(value))
    return snap


def _changes(snap: dict[Any, dict[str, Any]]) -> list[str]:
    out = []
    for owner, attrs in snap.items():
        now = vars(owner)
        out += [f"{owner.__name__}.{k}" for k in attrs if now.get(k, attrs) is not attrs[k]]
        out += [f"{owner.__name__}.{k} (added)" for k in now.keys() - attrs.keys()]
    return out


@pytest.fixture
def pristine(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    foreach_reduce_aliases()  # imports the FSDP internals before the snapshot
    snap = _snapshot()
    leaked = [f"{getattr(o, '__name__', o)}.{k}" for o, attrs in snap.items() for k, v in attrs.items()
              if getattr(v, PATCH_MARKER, None) is not None]
    assert not leaked, f"wrappers of ours left by an earlier test: {leaked}"
    yield monkeypatch
    undo_all()
    monkeypatch.undo()
    left = _changes(snap)
    for owner, attrs in snap.items():
        for k in vars(owner).keys() - attrs.keys():
            delattr(owner, k)
        for k, v in attrs.items():
            if vars(owner).get(k, attrs) is not v:
                setattr(owner, k, v)
    assert not left, f"not undone: {left}"


def _target(short: str) -> tuple[Any, str]:
    if short == "unused_param_reduction":
        return (GROUP, "__init__") if HAS_PUBLIC_SETTER else (GROUP, "post_backward")
    if short == "uniform_reduce_dtype":
        return PARAM_GROUP_MODULE, "foreach_reduce"
    if short == "accumulated_grad_guard":
        return PARAM, "to_accumulated_grad_if_needed"
    return GROUP, "post_backward"


def _counting(fn: Any, calls: list[str], label: str = "foreign") -> Any:
    """Another library's wrapper: counts its calls, made with ``functools.wraps``."""

    @functools.wraps(fn)
    def foreign(*args: Any, **kwargs: Any) -> Any:
        calls.append(label)
        return fn(*args, **kwargs)

    return foreign


# --------------------------------------------------------------------- API shape


def test_public_api() -> None:
    assert set(FOUR) <= set(PATCHES)
    for name in fsdp_patches.__all__:
        assert hasattr(fsdp_patches, name)
    for name in ("clip_grad_norm_", "get_total_grad_norm", "scale_grads_", "undo_all"):
        assert callable(getattr(fsdp_patches, name))
    from fsdp_patches.grads import clip_grad_norm_, get_total_grad_norm, scale_grads_

    assert (clip_grad_norm_, get_total_grad_norm, scale_grads_) == (
        fsdp_patches.clip_grad_norm_, fsdp_patches.get_total_grad_norm, fsdp_patches.scale_grads_)
    result = PatchResult(name="x", status="installed", reason="r")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "other"  # type: ignore[misc]
    assert result.undo() == []  # nothing of "x" was installed


def test_no_assert_statements_in_the_package() -> None:
    import ast
    from pathlib import Path

    for path in Path(fsdp_patches.__file__).parent.glob("*.py"):
        asserts = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Assert)]
        assert not asserts, f"{path.name}: assert on lines {asserts}"


# ---------------------------------------------------------- idempotence, undo


@pytest.mark.parametrize("short", FOUR)
def test_install_twice_undo_install_again(short: str, pristine: pytest.MonkeyPatch) -> None:
    owner, attr = _target(short)
    original = vars(owner)[attr]
    first = PATCHES[short]()
    wrapper = vars(owner)[attr]
    second = PATCHES[short]()
    assert (first.status, second.status) == ("installed", "already-installed")
    assert first.name == second.name == short
    assert vars(owner)[attr] is wrapper and wrapper.__wrapped__ is original
    assert getattr(wrapper, PATCH_MARKER).patch == short
    assert getattr(original, PATCH_MARKER, None) is None

    lines = second.undo()  # any result of the patch undoes it
    assert lines and all(line.endswith(": restored") for line in lines)
    assert vars(owner)[attr] is original
    assert first.undo() == [] and second.undo() == []  # idempotent
    again = PATCHES[short]()
    assert again.status == "installed" and vars(owner)[attr].__wrapped__ is original


def test_apply_all_twice_then_undo_all(pristine: pytest.MonkeyPatch) -> None:
    originals = {name: vars(owner)[attr] for name in FOUR for owner, attr in [_target(name)]}
    first = apply_all()
    second = apply_all()
    assert list(first) == list(PATCHES)
    assert all(r.status in ("installed", "not-applicable") for r in first.values()), first
    for name, result in first.items():
        expected = "already-installed" if result.status == "installed" else "not-applicable"
        assert second[name].status == expected, second
    undone = undo_all()
    assert set(undone) == {n for n, r in first.items() if r.status == "installed"}
    assert all(vars(owner)[attr] is originals[n] for n in FOUR for owner, attr in [_target(n)])
    assert undo_all() == {}


def test_foreach_reduce_wrapped_in_every_alias(pristine: pytest.MonkeyPatch) -> None:
    aliases = foreach_reduce_aliases()
    assert aliases[0] == (COLLECTIVES, "foreach_reduce")
    assert (PARAM_GROUP_MODULE, "foreach_reduce") in aliases
    original = COLLECTIVES.foreach_reduce
    fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    wrappers = {id(getattr(m, a)) for m, a in aliases}
    assert len(wrappers) == 1  # one wrapper for the aliases that held the same function
    assert all(getattr(m, a).__wrapped__ is original for m, a in aliases)


def test_fallback_zero_fill_composes_with_restore(pristine: pytest.MonkeyPatch) -> None:
    """Without the public setter (torch < 2.13) A and E both wrap post_backward, once each."""
    original = vars(GROUP)["post_backward"]
    pristine.delattr(MODULE, "set_reduce_scatter_unused_params", raising=False)
    results = [
        fsdp_patches.patch_fsdp_restore_unused_param_grads(),
        fsdp_patches.patch_fsdp_unused_param_reduction(),
        fsdp_patches.patch_fsdp_unused_param_reduction(),
        fsdp_patches.patch_fsdp_restore_unused_param_grads(),
    ]
    assert [r.status for r in results] == ["installed", "installed", "already-installed", "already-installed"]
    assert "zero-fill" in results[1].reason
    outer = GROUP.post_backward
    assert [getattr(outer, PATCH_MARKER).patch, getattr(outer.__wrapped__, PATCH_MARKER).patch] == [
        "unused_param_reduction", "restore_unused_param_grads"]
    assert outer.__wrapped__.__wrapped__ is original
    results[0].undo()  # E first: A still wraps it, so E becomes a pass-through
    assert GROUP.post_backward is outer
    results[1].undo()  # A is on top: restored past E's pass-through to torch's function
    assert vars(GROUP)["post_backward"] is original


# ------------------------------------------------- other code's wrappers, both orders


@pytest.mark.parametrize("short", FOUR)
def test_foreign_wrapper_first_is_kept_inside_ours(short: str, pristine: pytest.MonkeyPatch) -> None:
    owner, attr = _target(short)
    original = vars(owner)[attr]
    foreign = _counting(original, [])
    pristine.setattr(owner, attr, foreign)
    assert PATCHES[short]().status == "installed"
    ours = vars(owner)[attr]
    assert ours.__wrapped__ is foreign  # wraps what is there now, not torch's function
    assert PATCHES[short]().status == "already-installed"
    lines = undo_patch(short)
    assert lines and all(line.endswith(": restored") for line in lines), lines
    assert vars(owner)[attr] is foreign


@pytest.mark.parametrize("short", FOUR)
def test_foreign_wrapper_on_top_survives_undo(short: str, pristine: pytest.MonkeyPatch) -> None:
    owner, attr = _target(short)
    original = vars(owner)[attr]
    assert PATCHES[short]().status == "installed"
    ours = vars(owner)[attr]
    foreign = _counting(ours, [])
    setattr(owner, attr, foreign)
    assert PATCHES[short]().status == "already-installed"  # found through the foreign wrapper
    lines = undo_patch(short)
    assert any("passes through" in line for line in lines), lines
    assert vars(owner)[attr] is foreign and not active_wrapper_in_chain(foreign, short)
    assert PATCHES[short]().status == "installed"  # installing again wraps the foreign one
    assert vars(owner)[attr].__wrapped__ is foreign
    assert all(line.endswith(": restored") for line in undo_patch(short))
    assert vars(owner)[attr] is foreign
    setattr(owner, attr, original)  # the other library takes its wrapper out


def test_foreign_wrapper_on_one_alias_only(pristine: pytest.MonkeyPatch) -> None:
    """A wrapper on the name post_backward calls is kept; the other alias gets its own."""
    original = COLLECTIVES.foreach_reduce
    foreign = _counting(original, [])
    pristine.setattr(PARAM_GROUP_MODULE, "foreach_reduce", foreign)
    result = fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    assert result.status == "installed"
    assert PARAM_GROUP_MODULE.foreach_reduce.__wrapped__ is foreign
    assert COLLECTIVES.foreach_reduce.__wrapped__ is original
    result.undo()
    assert PARAM_GROUP_MODULE.foreach_reduce is foreign and COLLECTIVES.foreach_reduce is original


def test_pass_through_and_copied_marks_on_a_plain_module() -> None:
    owner = types.ModuleType("owner")
    owner.f = lambda x: x
    calls: list[str] = []
    ours = make_wrapper(owner.f, "demo", lambda call, x: call(x) + 100)
    assert replace_attribute(owner, "f", ours) == "owner.f"
    foreign = _counting(ours, calls)  # functools.wraps copies our mark into it
    owner.f = foreign
    assert getattr(foreign, PATCH_MARKER) is getattr(ours, PATCH_MARKER)
    assert owner.f(1) == 101 and calls == ["foreign"]
    assert undo_patch("demo") == ["owner.f: wrapped or replaced by other code since; ours now passes through"]
    assert owner.f(1) == 1 and calls == ["foreign", "foreign"]  # their chain still works
    assert not active_wrapper_in_chain(owner.f, "demo")  # the copied mark does not count
    assert undo_patch("demo") == []
    with pytest.raises(ValueError, match="not a wrapper made by make_wrapper"):
        replace_attribute(owner, "f", foreign)


# --------------------------------------------------------------- not-applicable


def test_unused_param_reduction_not_applicable(pristine: pytest.MonkeyPatch) -> None:
    pristine.delattr(MODULE, "set_reduce_scatter_unused_params", raising=False)
    pristine.delattr(GROUP, "post_backward")
    result = fsdp_patches.patch_fsdp_unused_param_reduction()
    assert result.status == "not-applicable" and "post_backward" in result.reason


def test_uniform_reduce_dtype_not_applicable_without_target(pristine: pytest.MonkeyPatch) -> None:
    pristine.delattr(COLLECTIVES, "foreach_reduce")
    result = fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    assert result.status == "not-applicable" and "foreach_reduce" in result.reason


def test_uniform_reduce_dtype_not_applicable_when_fixed(pristine: pytest.MonkeyPatch) -> None:
    """Torch's foreach_reduce without the uniform-dtype assertion (as in 2.15) is left alone."""

    def foreach_reduce(fsdp_params: list[Any], unsharded_grads: list[torch.Tensor]) -> None:
        return None

    foreach_reduce.__module__ = COLLECTIVES.__name__  # stands for torch's own function
    for module, attr in foreach_reduce_aliases():
        pristine.setattr(module, attr, foreach_reduce)
    result = fsdp_patches.patch_fsdp_uniform_reduce_dtype()
    assert result.status == "not-applicable" and "natively" in result.reason
    assert COLLECTIVES.foreach_reduce is foreach_reduce


def test_accumulated_grad_guard_not_applicable(pristine: pytest.MonkeyPatch) -> None:
    pristine.delattr(PARAM, "to_accumulated_grad_if_needed")
    result = fsdp_patches.patch_fsdp_accumulated_grad_guard()
    assert result.status == "not-applicable"
    assert not hasattr(PARAM, "to_accumulated_grad_if_needed")


def test_restore_unused_param_grads_not_applicable(pristine: pytest.MonkeyPatch) -> None:
    pristine.delattr(GROUP, "post_backward")
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


def test_widening_passes_positional_and_keyword_grads() -> None:
    seen: list[set[torch.dtype]] = []

    def foreach_reduce(fsdp_params: list[Any], unsharded_grads: list[torch.Tensor], group: Any = None) -> str:
        seen.append({g.dtype for g in unsharded_grads})
        return "done"

    wrapper = make_wrapper(foreach_reduce, "uniform_reduce_dtype", widening(1))
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
    def guarded(method: Any) -> Any:
        return functools.partial(guard_missing_unsharded_param, method)

    assert guarded(_FakeParam.convert)(_FakeParam()) is None
    with pytest.raises(AttributeError, match="_something_else"):
        guarded(_FakeParam.other)(_FakeParam())
    with pytest.raises(RuntimeError, match="boom"):
        guarded(_FakeParam.raise_runtime)(_FakeParam())

    present = _FakeParam()
    present._unsharded_param = object()  # has the attribute, but no .grad
    with pytest.raises(AttributeError):
        guarded(_FakeParam.convert)(present)


def test_guard_predicate_checks_the_object() -> None:
    owner, stranger = _FakeParam(), _FakeParam()
    error = AttributeError("'FSDPParam' object has no attribute '_unsharded_param'")
    assert is_missing_unsharded_param_error(owner, error)
    foreign = AttributeError("x", name="_unsharded_param", obj=stranger)
    assert not is_missing_unsharded_param_error(owner, foreign)
    assert not is_missing_unsharded_param_error(owner, KeyError("_unsharded_param"))
