"""Process-wide torch and Python state: taken before a cell, put back after it.

A launch runs many cells in one process (a rank runs many world-size-1 cells in a row),
so what a scenario changes process-wide would change every cell after it: a model
factory calling ``torch.set_default_dtype(torch.float64)`` makes the next scenario's
float32 batch meet float64 weights. ``GlobalState.take()`` records the state;
``restore()`` puts it back and returns one caveat line per thing the cell left changed
(the record's ``left_state``, shown in the report); the next cell starts clean.

Put back, with a caveat ("left the default dtype float64", "left deterministic
algorithms on", "left os.environ['X'] set"):

- default dtype and device; grad, anomaly and autocast modes; inference mode (a guard
  object, not a flag: a leaked one is turned off by a guard kept for the process's life);
- deterministic algorithms (and warn-only), ``fill_uninitialized_memory``, intra-op threads;
- the float32 matmul precision, TF32 and reduced-precision flags, ``fp32_precision``
  (torch 2.9+), as one caveat for the family; cuDNN and oneDNN flags. torch keeps the old
  flags beside the new settings and refuses to read an old one while they disagree: the
  old ones are set back first, then the new ones, which gives both back exactly;
- ``os.environ`` (names only: values may be secrets; the cache folders torch itself
  records on first use, ``TORCHINDUCTOR_CACHE_DIR``, are left alone) and ``sys.path``.

Put back silently: the RNG states (torch CPU, CUDA where initialised, ``random``, numpy's
where imported: every cell seeds its model and batches, drawing is expected), and
``warnings.filters`` unless an ``error`` filter was left (a module first imported during a
cell may add ignore-filters of its own; only ``error`` changes what later cells do).
Compared only: the inter-op thread count, which torch sets once per process. What the
restore could not put back is named "(not undone)". Grad, inference and autocast modes
and the default device are per thread: the cell's thread is the one restored.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.rank import environ as osenv

try:
    import torch.utils.deterministic  # noqa: F401 (fill_uninitialized_memory; absent in older torch)
except ImportError:
    pass

__all__ = ["GlobalState", "Setting", "SETTINGS"]

#: the precision settings' family: changes in it are reported as one caveat
_PRECISION = "the float32 matmul precision/TF32 settings"


#: a setting whose getter raised (torch refuses to read an old TF32 flag beside a changed new one)
_UNREADABLE = "<unreadable>"


@dataclass(kw_only=True, frozen=True)
class Setting:
    """One process-wide value with a getter and a setter."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]
    #: the caveat's text for the value the cell left; ``None``: "left <name> <value>"
    left: Callable[[Any], str] | None = None
    #: settings of one family are reported as one caveat
    family: str | None = None

    def caveat(self, value: Any) -> str:
        return self.left(value) if self.left else f"left {self.name} {value!r}"


def _flag(dotted: str, *, family: str | None = None) -> Setting | None:
    """The attribute ``torch.x.y.name`` as a setting, or None where this torch lacks it."""
    path, _, name = dotted.rpartition(".")
    obj: Any = torch
    for part in path.split(".")[1:]:
        if (obj := getattr(obj, part, None)) is None:
            return None
    try:
        getattr(obj, name)
    except AttributeError:
        return None
    except Exception:  # present, but torch refuses to read it now
        pass
    return Setting(name=dotted, get=lambda: getattr(obj, name), set=lambda v: setattr(obj, name, v), family=family)


def _default_device() -> str | None:
    """The device ``torch.set_default_device`` (or a ``with torch.device(...)`` never left)
    set, or None (factories make CPU tensors)."""
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    if context is not None:
        return str(getattr(context, "device", context))
    try:
        device = str(torch.get_default_device()) if hasattr(torch, "get_default_device") else "cpu"
    except AttributeError:  # torch < 2.10 after set_default_device(None)
        device = "cpu"
    return None if device == "cpu" else device


def _set_default_device(device: str | None) -> None:
    torch.set_default_device(device)
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if device is None and holder is not None and getattr(holder, "device_context", 0) is None:
        del holder.device_context  # as before any set: torch < 2.10 cannot read its default device otherwise


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def _settings() -> tuple[Setting, ...]:
    found: list[Setting | None] = [
        Setting(name="default dtype", get=torch.get_default_dtype, set=torch.set_default_dtype,
                left=lambda v: f"left the default dtype {str(v).removeprefix('torch.')}"),
        Setting(name="default device", get=_default_device, set=_set_default_device,
                left=lambda v: f"left the default device {v or 'unset'}"),
        Setting(name="grad mode", get=torch.is_grad_enabled, set=torch.set_grad_enabled,
                left=lambda v: f"left grad mode {_on_off(v)}"),
        Setting(name="anomaly mode", get=lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                set=lambda v: torch.set_anomaly_enabled(*v),
                left=lambda v: f"left anomaly detection {_on_off(v[0])}"),
        Setting(name="deterministic algorithms", get=_deterministic,
                set=lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
                left=lambda v: f"left deterministic algorithms {_on_off(v[0])}" + (" (warn only)" if v[0] and v[1] else "")),
        _flag("torch.utils.deterministic.fill_uninitialized_memory"),
        Setting(name="intra-op threads", get=torch.get_num_threads, set=torch.set_num_threads,
                left=lambda v: f"left the intra-op thread count {v}"),
    ]
    for device in ("cpu", "cuda"):
        found += _autocast(device)
    # the older precision settings, then (torch 2.9+) the fp32_precision ones, parents before
    # children: torch keeps both kinds, and only this order gives back both exactly
    found.append(Setting(name="float32 matmul precision", get=torch.get_float32_matmul_precision,
                         set=torch.set_float32_matmul_precision, family=_PRECISION,
                         left=lambda v: f"float32 matmul precision {v!r}"))
    found += [_flag(f"torch.backends.{name}", family=_PRECISION) for name in (
        "cuda.matmul.allow_tf32", "cudnn.allow_tf32", "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction", "fp32_precision", "cuda.matmul.fp32_precision", "cudnn.fp32_precision", "cudnn.conv.fp32_precision",
        "cudnn.rnn.fp32_precision", "mkldnn.fp32_precision", "mkldnn.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision", "mkldnn.rnn.fp32_precision")]
    found += [_flag(f"torch.backends.{name}") for name in ("cudnn.enabled", "cudnn.benchmark", "cudnn.deterministic",
                                                           "mkldnn.enabled")]
    return tuple(s for s in found if s is not None)


def _autocast(device: str) -> list[Setting | None]:
    try:
        torch.is_autocast_enabled(device)
        torch.get_autocast_dtype(device)
    except (TypeError, RuntimeError, AttributeError):  # an older torch or an unknown device type
        return []
    return [
        Setting(name=f"autocast ({device})", get=lambda: torch.is_autocast_enabled(device),
                set=lambda v: torch.set_autocast_enabled(device, v), left=lambda v: f"left autocast {_on_off(v)} for {device}"),
        Setting(name=f"autocast dtype ({device})", get=lambda: torch.get_autocast_dtype(device),
                set=lambda v: torch.set_autocast_dtype(device, v),
                left=lambda v: f"left the autocast dtype {str(v).removeprefix('torch.')} for {device}"),
    ]


#: every setting this torch has, in restore order
SETTINGS: tuple[Setting, ...] = _settings()

#: inference-mode guards that turned a leaked inference mode off; kept for the process's life
_HELD_GUARDS: list[Any] = []


def _read(setting: Setting) -> Any:
    try:
        return setting.get()
    except Exception:
        return _UNREADABLE


@dataclass(kw_only=True)
class _Rng:
    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def take(cls) -> _Rng:
        numpy = sys.modules.get("numpy")
        return cls(torch_cpu=torch.get_rng_state(),
                   cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
                   python=random.getstate(), numpy=numpy.random.get_state() if numpy is not None else None)

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None and torch.cuda.is_initialized():
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if self.numpy is not None and numpy is not None:
            numpy.random.set_state(self.numpy)


@dataclass(kw_only=True)
class GlobalState:
    """What torch and Python keep process-wide, at one moment (``take``)."""

    settings: dict[str, Any]
    inference_mode: bool
    interop_threads: int
    #: ``os.environ`` as the OS holds it (``harness.rank.environ``); decoded only where it changed
    environ: dict[Any, Any]
    sys_path: list[str]
    warning_filters: list[Any]
    rng: _Rng | None = field(default=None, repr=False)

    @classmethod
    def take(cls, *, rng: bool = True) -> GlobalState:
        """The state now; ``rng=False``: without the random generators' states (never compared, only put back)."""
        return cls(settings={s.name: _read(s) for s in SETTINGS}, inference_mode=torch.is_inference_mode_enabled(),
                   interop_threads=torch.get_num_interop_threads(), environ=osenv.now(),
                   sys_path=list(sys.path), warning_filters=list(warnings.filters), rng=_Rng.take() if rng else None)

    def changes(self, now: GlobalState | None = None) -> list[str]:
        """One caveat line per thing that differs in ``now`` (default: the state now) from this state."""
        now = now or GlobalState.take(rng=False)
        out: list[str] = []
        family: dict[str, list[str]] = {}
        for s in SETTINGS:
            before, after = self.settings.get(s.name), now.settings.get(s.name)
            if before == after:
                continue
            if s.family:  # an old flag torch will not read beside a changed new one says nothing more
                family.setdefault(s.family, [])
                if after != _UNREADABLE:
                    family[s.family].append(s.caveat(after).removeprefix("left "))
            else:
                out.append(s.caveat(after))
        out += [f"left {name} changed" + (f": {', '.join(items)}" if items else "") for name, items in family.items()]
        if now.inference_mode != self.inference_mode:
            out.append(f"left inference mode {_on_off(now.inference_mode)}")
        if now.interop_threads != self.interop_threads:
            out.append(f"changed the inter-op thread count to {now.interop_threads} (was {self.interop_threads}; "
                       f"cannot be set back)")
        if now.environ != self.environ:
            out += osenv.changes(osenv.decoded(self.environ), osenv.decoded(now.environ))
        if now.sys_path != self.sys_path:
            added = [p for p in now.sys_path if p not in self.sys_path]
            out.append("left sys.path changed" + (f" (added {', '.join(map(repr, added))})" if added else ""))
        errors = [f for f in now.warning_filters if f not in self.warning_filters and f[0] == "error"]
        if errors:
            out.append(f"left warnings.filters turning warnings into errors ({_describe_filter(errors[0])})")
        return out

    def restore(self) -> list[str]:
        """Put this state back; the caveats of what had changed, "(not undone)" where it stayed changed."""
        left = self.changes()
        if self.rng is not None:
            self.rng.restore()
        for s in SETTINGS:
            value = self.settings.get(s.name)
            if value == _UNREADABLE or _read(s) == value:
                continue
            try:
                s.set(value)
            except Exception:
                pass  # reported below as not undone
        if torch.is_inference_mode_enabled() and not self.inference_mode:
            _HELD_GUARDS.append(torch._C._InferenceMode(False))
        if osenv.now() != self.environ:
            osenv.put_back(self.environ)
        if sys.path != self.sys_path:
            sys.path[:] = self.sys_path
        if warnings.filters != self.warning_filters:
            warnings.filters[:] = self.warning_filters
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()
        stayed = set(self.changes()) if left else set()  # nothing named: nothing to look at again
        return [f"{c} (not undone)" if c in stayed and "cannot be set back" not in c else c for c in left]


def _describe_filter(entry: Any) -> str:
    _, message, category, _, _ = entry
    pattern = getattr(message, "pattern", "")
    return getattr(category, "__name__", str(category)) + (f", message {pattern!r}" if pattern else "")
