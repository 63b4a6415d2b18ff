"""Process-wide state between cells (``harness.rank.state``): what a cell leaves changed is
named and put back, RNG states come back silently. Each test puts the state back itself
(``restored``) so that a failing assertion cannot leak into the rest of the suite."""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import warnings

import pytest
import torch

from harness.rank import state
from harness.rank.state import SETTINGS, GlobalState
from harness.results.verdict import caveats
from tests.support import make_record


@pytest.fixture
def restored():
    """The state put back after the test, whatever it did; the test takes its own snapshot
    (pytest changes ``PYTEST_CURRENT_TEST`` between a fixture and the test)."""
    before = GlobalState.take()
    yield
    before.restore()


def test_an_unchanged_process_has_no_caveats(restored):
    restored = GlobalState.take()
    assert restored.changes() == []
    assert restored.restore() == []


def test_the_measured_leaks_are_named_and_put_back(restored):
    restored = GlobalState.take()
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    assert restored.restore() == ["left the default dtype float64", "left deterministic algorithms on"]
    assert torch.get_default_dtype() == torch.float32
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.ones(1).dtype == torch.float32
    assert restored.changes() == []


def test_modes_threads_and_flags(restored):
    restored = GlobalState.take()
    torch.set_grad_enabled(False)
    torch.set_anomaly_enabled(True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    left = restored.restore()
    assert left == ["left grad mode off", "left anomaly detection on", "left deterministic algorithms on (warn only)",
                    f"left the intra-op thread count {threads + 1}",
                    f"left torch.backends.cudnn.benchmark {torch.backends.cudnn.benchmark is False!r}"]
    assert torch.is_grad_enabled() and not torch.is_anomaly_enabled() and torch.get_num_threads() == threads
    assert restored.changes() == []


def test_the_precision_family_is_one_caveat_and_comes_back_exactly(restored):
    restored = GlobalState.take()
    torch.set_float32_matmul_precision("high")
    if any(s.name == "torch.backends.cuda.matmul.fp32_precision" for s in SETTINGS):  # torch 2.9+: the new API too
        torch.backends.cudnn.fp32_precision = "tf32"
    (left,) = restored.restore()
    assert left.startswith("left the float32 matmul precision/TF32 settings changed: float32 matmul precision 'high'")
    assert torch.get_float32_matmul_precision() == "highest"
    assert restored.changes() == []


def test_environ_and_sys_path_are_named_without_values(restored):
    restored = GlobalState.take()
    os.environ["FSDP_COMPAT_TEST_SET"] = "secret-value"
    name = next(iter(os.environ))
    old = os.environ[name]
    os.environ[name] = old + "-changed"
    sys.path.append("/nowhere/fsdp-compat")
    left = restored.restore()
    assert "left os.environ['FSDP_COMPAT_TEST_SET'] set" in left
    assert f"left os.environ[{name!r}] changed" in left
    assert "left sys.path changed (added '/nowhere/fsdp-compat')" in left
    assert not any("secret-value" in c for c in left)
    assert "FSDP_COMPAT_TEST_SET" not in os.environ and os.environ[name] == old
    assert "/nowhere/fsdp-compat" not in sys.path


def test_an_unset_variable_is_named_and_set_again(restored):
    os.environ["FSDP_COMPAT_TEST_UNSET"] = "1"
    before = GlobalState.take()
    del os.environ["FSDP_COMPAT_TEST_UNSET"]
    assert before.restore() == ["left os.environ['FSDP_COMPAT_TEST_UNSET'] unset"]
    assert os.environ["FSDP_COMPAT_TEST_UNSET"] == "1"


def test_warning_filters_come_back_and_only_an_error_filter_is_a_caveat(restored):
    restored = GlobalState.take()
    warnings.filterwarnings("ignore", message="fsdp-compat test")
    assert restored.restore() == []
    assert not any(f[1] is not None and f[1].pattern == "fsdp-compat test" for f in warnings.filters)
    warnings.simplefilter("error", DeprecationWarning)
    assert restored.restore() == ["left warnings.filters turning warnings into errors (DeprecationWarning)"]
    with warnings.catch_warnings(record=True):  # keeps the filters: raises if "error" were still there
        warnings.warn("not an error any more", DeprecationWarning, stacklevel=1)


def test_rng_states_come_back_silently(restored):
    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    before = GlobalState.take()
    torch.manual_seed(7)
    torch.rand(100)
    random.random()
    assert before.restore() == []
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_a_leaked_inference_mode_is_turned_off(restored):
    restored = GlobalState.take()
    leaked = torch.inference_mode()
    leaked.__enter__()  # entered, never left: the guard stays alive with ``leaked``
    assert torch.is_inference_mode_enabled()
    assert "left inference mode on" in restored.restore()
    assert not torch.is_inference_mode_enabled()
    assert torch.ones(1, requires_grad=True).mul(2).requires_grad


def test_a_leaked_default_device_is_unset(restored):
    restored = GlobalState.take()
    torch.set_default_device("meta")
    assert restored.restore() == ["left the default device meta"]
    assert torch.ones(1).device.type == "cpu"


def test_what_cannot_be_put_back_says_so(restored, monkeypatch):
    before = GlobalState.take()
    before.interop_threads += 1
    assert before.changes() == [f"changed the inter-op thread count to {before.interop_threads - 1} "
                                f"(was {before.interop_threads}; cannot be set back)"]
    broken = tuple(dataclasses.replace(s, set=lambda value: None) if s.name == "default dtype" else s
                   for s in state.SETTINGS)
    monkeypatch.setattr(state, "SETTINGS", broken)  # a setter that does nothing
    before = GlobalState.take()
    torch.set_default_dtype(torch.float64)
    assert before.restore() == ["left the default dtype float64 (not undone)"]
    torch.set_default_dtype(torch.float32)


def test_the_verdict_shows_each_caveat_once_with_its_variants():
    records = {"vanilla": make_record(variant="vanilla", left_state=["left the default dtype float64"]),
               "patched": make_record(variant="patched", left_state=["left the default dtype float64",
                                                                     "left os.environ['X'] set"]),
               "deployed": make_record(variant="deployed"), "api": None}
    assert caveats(records) == ("vanilla, patched left the default dtype float64", "patched left os.environ['X'] set")
