"""Compare what FSDP2 produced with the reference, step by step.

Checked per step: grad presence (None vs tensor, and presence that differs across ranks),
grads, total grad norm, clipped grads, post-step params, optimizer-state presence, and that
HSDP's replicas of every grad and param are equal (``StepTensors.diverged``).

Tolerance policy: each tensor is judged on its own scale, by its own dtype (the reference
tensor's), normwise: ``max |observed - reference| <= bound`` with

* grads, clipped grads: ``bound = rel * max|reference|``. ``rel`` sits just above the
  rounding noise of a correct run (measured over the CPU matrix, see ``TOLERANCES``), so a
  relative error of 1e-4 in any fp32 tensor is caught whatever its magnitude (a fixed
  ``atol`` let a 1e-3 error through in every tensor below 1e-2: clipped grads, biases,
  0.02-init weights);
* post-step params: ``bound = rel * U + PARAM_ULPS * eps * max|reference|``, where ``U``
  is the largest change the reference's optimizer step made to the param
  (``StepTensors.update``) and ``eps`` the dtype's machine epsilon: the step is judged on
  its own size, the param's own rounding on the param's. The reference stepped from the
  same params with the same grads (``harness.train.reference``), so this is tight;
* the total norm: ``bound = rel * |reference|``; the norm of bf16/fp16 grads within one unit
  in its last place (``eps``): torch rounds every parameter's norm to that dtype first.

An all-zero reference tensor must be matched by zeros. ``TOLERANCES`` gives ``rel`` per
dtype and the noise it was set against.

Presence and optimizer-state differences are never tolerated.

Non-finite values: a NaN or inf in the reference means the scenario itself is wrong
(``Comparison.reference_nonfinite``); one on the FSDP side only is a mismatch whose
note says "non-finite".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.train.step import StepTensors

__all__ = ["Comparison", "Diff", "TOLERANCES", "Tolerance", "compare_runs", "tolerance_of"]


@dataclass(kw_only=True, frozen=True)
class Tolerance:
    dtype: str
    #: of the tensor's own scale (its largest |value|; a post-step param: its largest update)
    rel: float


#: ``rel`` per dtype, each set just above the largest noise of a correct run, measured over the
#: full CPU matrix (9 torch versions, 2,406 passing records, AVX-512 kernels, 2026-12-04): fp32
#: grads 7.4e-7, post-step params 1.8e-6 of their update, clipped grads 9.9e-6 (a uniform
#: clip-coefficient difference from the 1e-6 torch adds to a sharded norm); bf16 grads 3.7e-3
#: (k2's API route all-gathers fp32-stored weights in bf16), so one bf16 ulp; fp16 8.0e-5. On a
#: GPU (H200, torch 2.11, reference on the same GPU) the GEMMs behind a grad accumulate in an
#: order the library picks by shape and alignment, and FSDP2's all-gathered weights are laid out
#: otherwise than the reference's: low-precision grads then differ by one rounding of the
#: output, measured 0.92 fp16 ulp and 0.95 bf16 ulp of the tensor's largest element. So both
#: low-precision dtypes get one ulp (``eps``); fp32 grads there agreed to the bit (60 passing cells).
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(dtype="float32", rel=2e-5),
    torch.bfloat16: Tolerance(dtype="bfloat16", rel=torch.finfo(torch.bfloat16).eps),
    torch.float16: Tolerance(dtype="float16", rel=torch.finfo(torch.float16).eps),
    # the scenarios' losses reduce in fp32 (``mean_square``): fp64 grads carry fp32's rounding
    torch.float64: Tolerance(dtype="float64", rel=2e-5),
}
#: a post-step param may differ by this many units of its dtype's epsilon times its own scale
PARAM_ULPS = 4


def tolerance_of(t: torch.Tensor) -> Tolerance:
    """The tolerance for a tensor of ``t``'s dtype (fp32's for anything not listed)."""
    return TOLERANCES.get(t.dtype, TOLERANCES[torch.float32])


@dataclass(kw_only=True)
class Diff:
    """One compared quantity. ``score`` > 1 means outside tolerance (inf: presence)."""

    step: int
    kind: str  # grad | presence | grad_norm | clipped | param | opt_state | replicas
    name: str
    max_abs: float | None = None
    #: ``max_abs`` over the tensor's own scale (see the module docstring)
    max_rel: float | None = None
    #: the reference tensor's dtype (what the tolerance was chosen by)
    dtype: str | None = None
    ok: bool = True
    score: float = 0.0
    note: str = ""

    @property
    def label(self) -> str:
        return f"step {self.step} {self.kind} {self.name}"


@dataclass(kw_only=True)
class Comparison:
    diffs: list[Diff] = field(default_factory=list)
    grad_norm: float | None = None
    ref_grad_norm: float | None = None
    #: labels of reference quantities that are NaN or inf (the scenario is wrong)
    reference_nonfinite: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs)

    def worst(self) -> Diff | None:
        return max(self.diffs, key=lambda d: d.score, default=None)

    def as_record_fields(self) -> dict:
        numeric = [d for d in self.diffs if d.max_abs is not None]
        worst = self.worst()
        ranked = sorted(self.diffs, key=lambda d: -d.score)
        return {
            "max_abs_diff": max((d.max_abs for d in numeric), default=None),
            "max_rel_diff": max((d.max_rel for d in numeric if d.max_rel is not None), default=None),
            "worst": None if worst is None else worst.label + (f" ({worst.note})" if worst.note else ""),
            "diffs": [_jsonable(vars(d)) for d in ranked[:200]],  # flat fields: no deep copy (``asdict``) needed
            "grad_norm": self.grad_norm,
            "ref_grad_norm": self.ref_grad_norm,
        }


def compare_runs(observed: list[StepTensors], reference: list[StepTensors]) -> Comparison:
    result = Comparison()
    assert len(observed) == len(reference), "observed and reference must cover the same steps"
    for obs, ref in zip(observed, reference):
        step = obs.step
        result.diffs += _compare_grads(step, "grad", obs.grads, ref.grads, obs.inconsistent)
        if ref.grad_norm is not None or obs.grad_norm is not None:
            result.diffs.append(_compare_scalar(step, "grad_norm", obs.grad_norm, ref.grad_norm, _norm_dtype(ref.grads)))
            if result.grad_norm is None:
                result.grad_norm, result.ref_grad_norm = obs.grad_norm, ref.grad_norm
        if ref.clipped or obs.clipped:
            result.diffs += _compare_grads(step, "clipped", obs.clipped, ref.clipped, {})
        for name, r in ref.params.items():
            tol = tolerance_of(r)
            scale = ref.update.get(name, _amax(r))
            floor = PARAM_ULPS * torch.finfo(r.dtype).eps * _amax(r) if r.is_floating_point() else 0.0
            result.diffs.append(_compare_tensor(step, "param", name, obs.params.get(name), r, scale=scale,
                                                bound=tol.rel * scale + floor))
        for label, gap in sorted(obs.diverged.items()):
            kind, _, name = label.partition(" ")
            result.diffs.append(Diff(step=step, kind="replicas", name=name, ok=False, score=math.inf,
                                     note=f"{kind}: HSDP replicas differ by up to {gap:.3g}"))
        for name, r in ref.opt_state.items():
            o = obs.opt_state.get(name)
            ok = o == r
            note = "" if ok else f"optimizer state: observed {'present' if o else 'absent'}, reference {'present' if r else 'absent'}"
            result.diffs.append(Diff(step=step, kind="opt_state", name=name, ok=ok, score=0.0 if ok else math.inf, note=note))
    result.reference_nonfinite = [d.label for d in result.diffs if d.note == _REF_NONFINITE]
    return result


_REF_NONFINITE = "reference is non-finite"


def _compare_grads(step, kind, obs, ref, inconsistent) -> list[Diff]:
    diffs = []
    for name, r in ref.items():
        o = obs.get(name)
        if name in inconsistent:
            diffs.append(_presence(step, name, f"grad on ranks {inconsistent[name]} only, reference {'has grad' if r is not None else 'None'}"))
        elif o is None and r is None:
            diffs.append(Diff(step=step, kind=kind, name=name, note="None on both"))
        elif o is None:
            diffs.append(_presence(step, name, f"observed None, reference has grad (max |g| {_amax(r):.3g})"))
        elif r is None:
            diffs.append(_presence(step, name, f"observed grad (max |g| {_amax(o):.3g}), reference None"))
        else:
            tol = tolerance_of(r)
            scale = _amax(r)
            diffs.append(_compare_tensor(step, kind, name, o, r, scale=scale, bound=tol.rel * scale))
    return diffs


def _presence(step: int, name: str, note: str) -> Diff:
    return Diff(step=step, kind="presence", name=name, ok=False, score=math.inf, note=note)


def _compare_tensor(step, kind, name, o, r, *, scale: float, bound: float) -> Diff:
    """``o`` against ``r``: ``max |o - r| <= bound`` (``scale``: what ``max_rel`` is relative to)."""
    if o is None:
        return Diff(step=step, kind=kind, name=name, ok=False, score=math.inf, note="missing on the FSDP side")
    if o.shape != r.shape:
        return Diff(step=step, kind=kind, name=name, ok=False, score=math.inf, note=f"shape {tuple(o.shape)} vs {tuple(r.shape)}")
    if not _finite(r):
        return Diff(step=step, kind=kind, name=name, ok=False, score=math.inf, note=_REF_NONFINITE)
    o64, r64 = o.detach().to(torch.float64), r.detach().to(torch.float64)
    if not bool(torch.isfinite(o64).all()):
        bad = int((~torch.isfinite(o64)).sum())
        return Diff(step=step, kind=kind, name=name, ok=False, score=math.inf,
                    note=f"non-finite: {bad} of {o64.numel()} values NaN or inf on the FSDP side")
    max_abs = float((o64 - r64).abs().max()) if r64.numel() else 0.0
    bound = max(bound, _TINY)
    return Diff(step=step, kind=kind, name=name, max_abs=max_abs, dtype=str(r.dtype).removeprefix("torch."),
                max_rel=max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf),
                ok=max_abs <= bound, score=max_abs / bound)


#: the smallest bound: an all-zero reference tensor must be matched by zeros (up to this)
_TINY = 1e-30


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _compare_scalar(step, kind, o, r, dtype: torch.dtype = torch.float32) -> Diff:
    """A total norm of grads of ``dtype``: within fp32's tolerance, or one unit in the last place
    of a bf16/fp16 norm (torch rounds each parameter's norm to that dtype before combining)."""
    if o is None or r is None:
        return Diff(step=step, kind=kind, name="total", ok=False, score=math.inf, note=f"observed {o}, reference {r}")
    ref = torch.tensor(r, dtype=torch.float32)
    rel = torch.finfo(dtype).eps if dtype in (torch.bfloat16, torch.float16) else TOLERANCES[torch.float32].rel
    return _compare_tensor(step, kind, "total", torch.tensor(o, dtype=torch.float32), ref, scale=abs(r),
                           bound=rel * abs(r))


def _norm_dtype(grads: dict[str, torch.Tensor | None]) -> torch.dtype:
    """The dtype a norm of ``grads`` is computed in: their promoted dtype (fp32 where none)."""
    dtypes = [g.dtype for g in grads.values() if g is not None]
    out = dtypes[0] if dtypes else torch.float32
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def _amax(t: torch.Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def _jsonable(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
