"""The bug legend: one row per bug class of the scenario library (torch-free data).

A bug's letter names its scenario files (``b2_mixed_dtype_late_param`` is bug B); the
README's legend table and the report's legend section are both made from ``BUGS``
(``python -m harness bugs`` prints the Markdown table; a test keeps the README equal to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BUGS", "Bug", "bug_for_scenario", "legend_markdown", "legend_rows"]

#: A scenario file's bug letter: ``b2_...`` -> ``b``; files without one are not bug scenarios.
_LETTERED = re.compile(r"^([a-z])\d*_")


@dataclass(kw_only=True, frozen=True)
class Bug:
    """One bug class: what users see, where upstream tracks it, which torch releases have it,
    and what replaces it (the project's patch or utility, and the public torch API)."""

    letter: str
    name: str
    symptom: str
    upstream: str
    affected: str
    patch: str = ""
    api: str = ""
    #: scenarios of this bug whose file names do not start with its letter
    scenarios: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z]", self.letter):
            raise ValueError(f"Bug.letter: {self.letter!r} is not one capital letter")
        for name in ("name", "symptom", "upstream", "affected"):
            if not getattr(self, name).strip():
                raise ValueError(f"bug {self.letter}: {name} is empty")


BUGS: tuple[Bug, ...] = (
    Bug(letter="A", name="Ranks use different parameters",
        symptom="gloo: \"Received data size doesn't match expected size\" (collective mismatch); NCCL hangs "
                "or corrupts grads",
        upstream="pytorch/pytorch#158719, pytorch/torchtitan#2747", affected="all (2.7 – 2.15)",
        patch="unused_param_reduction", api="FSDPModule.set_reduce_scatter_unused_params (2.13)"),
    Bug(letter="B", name="Mixed grad dtypes in one reduce-scatter under accumulation",
        symptom="AssertionError: FSDP reduce-scatter expects uniform gradient dtype but got "
                "{torch.bfloat16, torch.float32}",
        upstream="pytorch/pytorch#196996, pytorch/pytorch#160279", affected="2.7 – 2.14 (fixed in 2.15)",
        patch="uniform_reduce_dtype"),
    Bug(letter="C", name="A unit that never ran forward in a no-sync micro-batch (skipped vision tower)",
        symptom="AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'",
        upstream="pytorch/pytorch#194058, volcengine/verl#7475", affected="2.7 – 2.14 (method gone in 2.15)",
        patch="accumulated_grad_guard"),
    Bug(letter="D", name="HSDP deferred all-reduce with changing parameter usage",
        symptom="RuntimeError: The size of tensor a (32) must match the size of tensor b (64); "
                "or silently wrong grads",
        upstream="(none filed; found by this project)", affected="2.7 – 2.14 (fixed in 2.15)",
        patch="unused_param_reduction", api="FSDPModule.set_reduce_scatter_unused_params (2.13)"),
    Bug(letter="E", name="Globally unused parameters stepped by AdamW",
        symptom="silent: zero grads instead of None; AdamW decays the weight and creates state",
        upstream="(a consequence of A's fix and API)", affected="wherever A's fix or API is on",
        patch="restore_unused_param_grads"),
    Bug(letter="F", name="Grad norm and clipping with CPU-offloaded grads",
        symptom="RuntimeError: No backend type associated with device type cpu",
        upstream="pytorch/pytorch#148532, pytorch/torchtune#1977, inclusionAI/AReaL#644",
        affected="all, with an NCCL-only (CUDA-only) group", patch="clip_grad_norm"),
    Bug(letter="G", name="Scaling grads for accumulation with CPU offload",
        symptom="Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
        upstream="pytorch/torchtune#1941", affected="all, CUDA with CPU offload", patch="scale_grads",
        api="FSDPModule.set_gradient_divide_factor (2.8)"),
    Bug(letter="H", name="Infinity-norm clipping when a rank holds an empty shard",
        symptom="_foreach_norm cannot compute the infinity norm on an empty tensor (that rank only; "
                "the others wait in the collective)",
        upstream="(none filed; found by this project)", affected="all (2.7 – 2.15)", patch="clip_grad_norm"),
    Bug(letter="I", name="A unit frozen in its first forward and unfrozen later, under mixed precision",
        symptom="RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with dtype "
                "'float'; with bf16 master weights a silent bf16 reduction",
        upstream="pytorch/pytorch#186998 (fixed by pytorch/pytorch#187376)", affected="2.8 – 2.13 (fixed in 2.14)",
        patch="late_unfreeze_reduce_dtype"),
    Bug(letter="J", name="Clipping over parameters on two meshes (expert parallel with FSDP2)",
        symptom="All operands in aten.stack.default must have the same mesh",
        upstream="pytorch/pytorch#180346, NVIDIA-NeMo/Automodel#2012", affected="all (2.7 – 2.15)",
        patch="clip_grad_norm"),
    Bug(letter="K", name="Mixed parameter dtypes in one FSDP unit (LoRA adapters, fp32 routers)",
        symptom="AssertionError: FSDP expects uniform original parameter dtype but got "
                "{torch.bfloat16, torch.float32}",
        upstream="NVIDIA-NeMo/Automodel#2655, huggingface/accelerate#3985",
        affected="frozen mix 2.7 only; trainable mix 2.7 – 2.15", patch="shard_by_dtype",
        api="MixedPrecisionPolicy.param_dtype_override_fn (2.15; compute dtype only)"),
    Bug(letter="L", name="All-gather extension hooks on uneven shards (tensor-subclass weights)",
        symptom="gloo: rank aborts (SIGABRT, enforce fail in the transport: sizes differ); NCCL hangs",
        upstream="pytorch/ao#3982", affected="all (2.7 – 2.15); the fix is in the subclass"),
    Bug(letter="M", name="gloo computes FSDP2's AVG reduce-scatter as a sum",
        symptom="silent: grads world-size times too large on CPU/gloo",
        upstream="pytorch/pytorch#162338", affected="2.7 – 2.8 (CPU/gloo only)",
        patch="gloo_reduce_scatter_avg", api="FSDPModule.set_force_sum_reduction_for_comms (2.8)",
        scenarios=("gloo_avg_reduce_scatter",)),
    Bug(letter="N", name="Random init of a meta-device model after fully_shard (reset_parameters)",
        symptom="silent: on CPU every rank fills its shard from the start of one random stream, not a "
                "slice of the full init a single process draws",
        upstream="pytorch/pytorch#180088, pytorch/torchtitan#3106", affected="all, CPU measured (2.7 – 2.15)",
        patch="meta_init_full_rng"),
    Bug(letter="O", name="Reducing grads after an accumulation window run with sync off (MoE, pipeline schedules)",
        symptom="silent: turning gradient sync back on reduces nothing accumulated; sharded grads stay None",
        upstream="(no public call before 2.15; NVIDIA-NeMo/Automodel MoEFSDPSyncMixin)", affected="2.7 – 2.14",
        patch="finalize_backward", api="FSDPModule.set_manual_backward_finalization + finalize_backward (2.15)"),
    Bug(letter="P", name="A tied parameter sharded in two FSDP groups (embedding tied to the output head)",
        symptom="silent: the tie is broken, the tied weight's grad lacks the head's part; later releases: "
                "ValueError: Parameter 'emb.weight' is shared with a parameter already managed by another FSDP group",
        upstream="pytorch/pytorch#176076, pytorch/torchtitan#2495, huggingface/accelerate#4171",
        affected="2.7 – 2.11 silent; refused from 2.12", api="fully_shard([emb, head]): the tied modules as one group"),
    Bug(letter="Q", name="A frozen non-float parameter in an FSDP unit (packed weights of a quantized base)",
        symptom="RuntimeError: only Tensors of floating point dtype can require gradients",
        upstream="pytorch/pytorch#177844, pytorch/pytorch#185239", affected="2.7 – 2.11 (fixed in 2.12)",
        patch="nonfloat_params"),
    Bug(letter="R", name="A DTensor sliced over its whole extent (an alias) has no sharding strategy",
        symptom="NotImplementedError: Operator aten.alias.default does not have a sharding strategy registered.",
        upstream="pytorch/pytorch#170427 (fixed by pytorch/pytorch#166867)", affected="2.9 (2.9.0 and 2.9.1)",
        patch="alias_sharding_strategy"),
    Bug(letter="S", name="A parameter's grad_dtype dropped by fully_shard (bf16 weights, fp32 grads asked)",
        symptom="silent: grads come out bf16 where fp32 was asked; reduced and kept in bf16",
        upstream="pytorch/pytorch#170648", affected="2.10 – 2.14 (fixed in 2.15; no grad_dtype before 2.10)"),
    Bug(letter="T", name="A non-persistent buffer after a meta-device build and a rank-0 checkpoint broadcast",
        symptom="silent: the buffer keeps to_empty's uninitialised memory on every rank (NaN losses, or wrong values)",
        upstream="volcengine/verl#6365, hiyouga/LlamaFactory#10820, EvolvingLMMs-Lab/lmms-engine#185",
        affected="all (2.7 – 2.15): no state dict holds the buffer; the loader must restore it"),
    Bug(letter="U", name="A unit's weight used outside its forward (fused linear cross-entropy on the output head)",
        symptom="RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor, need to convert all "
                "torch.Tensor to DTensor before calling distributed operators!",
        upstream="NVIDIA-NeMo/Automodel#3708, huggingface/trl#6330, meta-pytorch/torchtune#2800",
        affected="all (2.7 – 2.15): keep the unit gathered until backward (torch's setter from 2.8)",
        patch="set_reshard_after_forward",
        api="FSDPModule.set_reshard_after_forward(False) (torch >= 2.8)"),
)


def bug_for_scenario(scenario: str) -> Bug | None:
    """The bug a scenario file reproduces, by its letter prefix (``None`` for others)."""
    listed = next((b for b in BUGS if scenario in b.scenarios), None)
    m = _LETTERED.match(scenario)
    if listed is not None or m is None:
        return listed
    return next((b for b in BUGS if b.letter == m.group(1).upper()), None)


def legend_rows(scenarios: Iterable[str] | None = None) -> list[dict[str, str]]:
    """The legend as rows (the report's data); given the scenarios of a report, each row
    also names those of its bug ("scenarios in this report")."""
    rows = [{"bug": b.letter, "name": b.name, "symptom": b.symptom, "upstream": b.upstream,
             "affected torch": b.affected, "patch": b.patch or "—", "public API": b.api or "—"} for b in BUGS]
    if scenarios is not None:
        here = sorted(set(scenarios))
        for row, bug in zip(rows, BUGS, strict=True):
            row["scenarios in this report"] = ", ".join(s for s in here if bug_for_scenario(s) is bug) or "—"
    return rows


def legend_markdown() -> str:
    """The legend as a Markdown table (the README's copy)."""
    import pandas as pd

    rows = [{k: v.replace("|", "\\|") for k, v in row.items()} for row in legend_rows()]
    return pd.DataFrame(rows).to_markdown(index=False, tablefmt="pipe") + "\n"
