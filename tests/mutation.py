"""Mutation check of the scenario library: small realistic mistakes in copies of the
project's own patches (one change each, the kind made when porting a patch to a new
torch), each run through the harness on the scenarios that exercise it.

Each mutant names the cells that must catch it (``Catch``: the cell, the status it must end
with, a text its failure shows). It is killed only when one of those cells does; a mutant
that only some other cell notices (an install error, a hang) is "caught elsewhere", and one
that nothing notices survived: both mean a scenario is missing or a name is stale. Mutants of
the pre-2.13 code paths run on an older torch (its matrix venv). ``nox -s mutants`` runs them
and prints the table and the kill ratio; the exit code is 1 unless every mutant is killed.

    python tests/mutation.py [--only NAME ...] [--python-for 2.12.1=/path/to/python]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.envs.session import bytecode_env, harness_folder  # noqa: E402

PATCHES = ROOT / "fsdp_patches"
DEFAULT_TORCH = "2.13.0"


@dataclass(kw_only=True, frozen=True)
class Catch:
    """A cell that must catch a mutant: ``scenario[variant,wN]``, the status it must end with, and
    a text its failure (message, traceback or worst difference) shows."""

    cell: str
    status: str
    match: str = ""

    def caught(self, record: dict) -> bool:
        label = f"{record['scenario']}[{record['variant']},w{record['world_size']}]"
        text = "\n".join(str(record.get(k) or "") for k in ("exc_msg", "traceback", "worst"))
        return (not record["as_expected"] and label == self.cell and record["status"] == self.status
                and self.match in text)


@dataclass(kw_only=True, frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    scenarios: tuple[str, ...]
    why: str
    #: the cells that must catch it (one is enough)
    caught_by: tuple[Catch, ...]
    torch: str = DEFAULT_TORCH
    world_sizes: tuple[int, ...] = field(default=())


A_SCENARIOS = ("a_rank_divergent", "d1_hsdp_extra_first_micro_batch", "d2_hsdp_swapped_layers")
E_SCENARIOS = ("e_globally_unused_adamw", "e_hsdp_globally_unused", "e_param_used_in_one_step",
               "b1_mixed_dtype_unused_api")
B_SCENARIOS = ("b1_mixed_dtype_unused_api", "b2_mixed_dtype_late_param", "b3_mixed_dtype_rank0_only")
I_SCENARIOS = ("i1_unfreeze_after_first_forward_mp", "i2_unfreeze_bf16_master", "i3_unfreeze_bf16_master_accumulate")
CLIP_SCENARIOS = ("f_offload_clip_nccl_only", "f_offload_clip_under_max_norm", "h_inf_norm_empty_shard", "hsdp_clip",
                  "plain")

MUTANTS: tuple[Mutant, ...] = (
    Mutant(name="a_flag_not_set", file="unused_params.py",
           old="    self.reduce_scatter_unused_params = True\n",
           new="    self.reduce_scatter_unused_params = getattr(self, 'reduce_scatter_unused_params', False)\n",
           scenarios=A_SCENARIOS, caught_by=(Catch(cell="a_rank_divergent[patched,w2]", status="crash", match='enforce fail'), Catch(cell="d2_hsdp_swapped_layers[patched,w4]", status="mismatch", match='presence a.weight'),),
           why="2.13+: keeps torch's default instead of turning the flag on"),
    Mutant(name="a_fill_every_backward", file="unused_params.py",
           old='filled = _zero_fill_unused_grads(self) if getattr(self, "reduce_grads", True) else []',
           new="filled = _zero_fill_unused_grads(self)",
           scenarios=(*A_SCENARIOS, *E_SCENARIOS), torch="2.12.1",
           caught_by=(Catch(cell="e_param_used_in_one_step[patched,w2]", status="mismatch", match='reference None'),),
           why="pre-2.13 fill: zero-fills on no-sync micro-batches too"),
    Mutant(name="a_fill_sharded_shape", file="unused_params.py",
           old="        zero = torch.zeros_like(unsharded)\n",
           new="        zero = torch.zeros_like(fsdp_param.sharded_param)\n",
           scenarios=(*A_SCENARIOS, *E_SCENARIOS), torch="2.12.1",
           caught_by=(Catch(cell="a_rank_divergent[patched,w4]", status="error", match='got mixed torch.Tensor and DTensor'),),
           why="pre-2.13 fill: zero grad shaped like the local shard, not the unsharded param"),
    Mutant(name="e_shard_group_only", file="unused_params.py",
           old='        getattr(group.mesh_info, "replicate_process_group", None),\n', new="",
           scenarios=E_SCENARIOS, caught_by=(Catch(cell="e_hsdp_globally_unused[patched,w4]", status="mismatch", match='presence rare.weight'),),
           why="decides 'unused' over the shard group only, not the replicas"),
    Mutant(name="e_drops_existing_grads", file="unused_params.py",
           old="if not was_used and was_none and fsdp_param.sharded_param.grad is not None:",
           new="if not was_used and fsdp_param.sharded_param.grad is not None:",
           scenarios=E_SCENARIOS, caught_by=(Catch(cell="e_param_used_in_one_step[patched,w2]", status="mismatch", match='presence sometimes.weight (observed None'),),
           why="also drops a grad that zero_grad(set_to_none=False) left"),
    Mutant(name="e_none_check_after_reduce", file="unused_params.py",
           old="    grad_was_none = [p.sharded_param.grad is None for p in fsdp_params]\n"
               "    used = _or_over_reduction_domain(self, local_used)\n"
               "    result = post_backward(self, *args, **kwargs)\n",
           new="    used = _or_over_reduction_domain(self, local_used)\n"
               "    result = post_backward(self, *args, **kwargs)\n"
               "    grad_was_none = [p.sharded_param.grad is None for p in fsdp_params]\n",
           scenarios=E_SCENARIOS, caught_by=(Catch(cell="e_globally_unused_adamw[patched,w2]", status="mismatch", match='reference None'),),
           why="checks 'no grad before' after the reduction has assigned one"),
    Mutant(name="b_widen_to_narrowest", file="reduce_dtype.py",
           old="    return functools.reduce(torch.promote_types, unique)\n",
           new="    return min(unique, key=lambda d: torch.finfo(d).bits)\n",
           scenarios=B_SCENARIOS, caught_by=(Catch(cell="b2_mixed_dtype_late_param[patched,w4]", status="mismatch", match='grad used.'),),
           why="widens the group to bf16 instead of fp32"),
    Mutant(name="b_one_alias_only", file="reduce_dtype.py",
           old="    for module, attr in aliases:\n        current = getattr(module, attr)\n",
           new="    for module, attr in aliases[:1]:\n        current = getattr(module, attr)\n",
           scenarios=B_SCENARIOS, caught_by=(Catch(cell="b2_mixed_dtype_late_param[patched,w4]", status="error", match='uniform gradient dtype'),),
           why="wraps _fsdp_collectives.foreach_reduce but not the name post_backward calls"),
    Mutant(name="c_wrong_method", file="accumulated_grad.py",
           old='_METHOD = "to_accumulated_grad_if_needed"', new='_METHOD = "to_accumulated_grad"',
           scenarios=("c_skipped_vision_tower",), caught_by=(Catch(cell="c_skipped_vision_tower[patched,w2]", status="error", match='_unsharded_param'),),
           why="guards a method name from another release"),
    Mutant(name="c_guard_checks_wrong_attr", file="accumulated_grad.py",
           old="        return name == _ATTR\n", new='        return name == "unsharded_param"\n',
           scenarios=("c_skipped_vision_tower",), caught_by=(Catch(cell="c_skipped_vision_tower[patched,w2]", status="error", match='_unsharded_param'),),
           why="matches the public property name, not the missing attribute"),
    Mutant(name="clip_no_clamp", file="grads.py",
           old="clip_coef = torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)",
           new="clip_coef = float(max_norm) / (total_norm + 1e-6)",
           scenarios=CLIP_SCENARIOS, caught_by=(Catch(cell="f_offload_clip_under_max_norm[patched,w2]", status="mismatch", match='clipped'),),
           why="scales grads up when the norm is under max_norm"),
    Mutant(name="clip_local_norm", file="_grad_norm.py",
           old="        if is_shard_placement(placement):\n            reduce_dims.append(mesh_dim)\n",
           new="        if is_shard_placement(placement):\n            pass\n",
           scenarios=CLIP_SCENARIOS, caught_by=(Catch(cell="f_offload_clip_nccl_only[patched,w4]", status="mismatch", match='clipped'), Catch(cell="hsdp_clip[patched,w4]", status="mismatch", match='clipped'),),
           why="uses this rank's shard norm as the total"),
    Mutant(name="clip_counts_replicas", file="_grad_norm.py",
           old="        if is_shard_placement(placement):\n            reduce_dims.append(mesh_dim)\n",
           new="        if is_shard_placement(placement) or placement.is_replicate():\n            reduce_dims.append(mesh_dim)\n",
           scenarios=CLIP_SCENARIOS, caught_by=(Catch(cell="hsdp_clip[patched,w2]", status="mismatch", match='grad_norm'),),
           why="sums the norm over HSDP replicas too"),
    Mutant(name="clip_strided_shard_as_replica", file="_grad_tensors.py",
           old="    return _StridedShard is not None and isinstance(placement, _StridedShard)\n",
           new="    return False\n",
           scenarios=("j_clip_two_meshes",),
           caught_by=(Catch(cell="j_clip_two_meshes[patched,w2]", status="error", match='_StridedShard'),),
           why="trusts is_shard(), which is False for _StridedShard (FSDP2 over an expert-parallel dim) "
               "from torch 2.10"),
    Mutant(name="clip_keeps_empty_shards", file="_grad_norm.py",
           old="        t for t in tensors if t.numel() > 0\n", new="        t for t in tensors\n",
           scenarios=CLIP_SCENARIOS, caught_by=(Catch(cell="h_inf_norm_empty_shard[patched,w2]", status="error", match='cannot compute the infinity norm'),),
           why="computes the inf norm of an empty local shard"),
    Mutant(name="clip_scalar_on_cpu", file="_grad_reduce.py",
           old='    if "cpu" in served:\n', new="    if True:\n",
           scenarios=CLIP_SCENARIOS, caught_by=(Catch(cell="f_offload_clip_nccl_only[patched,w2]", status="error", match='No backend type associated with device type cpu'),),
           why="reduces the norm on the CPU whatever the group serves"),
    Mutant(name="k_trainable_only_on_2_7", file="by_dtype.py",
           old='    return "requires_grad" not in source\n', new="    return False\n",
           scenarios=("k1_lora_frozen_base",), torch="2.7.1",
           caught_by=(Catch(cell="k1_lora_frozen_base[patched,w2]", status="error", match='uniform original parameter dtype'),),
           why="applies the 2.8 rule (trainable parameters only) to 2.7, which checks frozen ones too"),
    Mutant(name="k_no_recursion", file="by_dtype.py",
           old='            visit(child, f"{path}{name}.")\n', new="            continue\n",
           scenarios=("k2_trainable_mixed_dtypes",),
           caught_by=(Catch(cell="k2_trainable_mixed_dtypes[patched,w2]", status="error", match='uniform original parameter dtype'),),
           why="looks at direct children only: a router nested in a mixed block stays in the bf16 unit"),
    Mutant(name="k_root_first", file="by_dtype.py",
           old="    for modules in split_by_dtype(module, set(kwargs.get(\"ignored_params\") or ())).values():\n"
               "        shard(modules if len(modules) > 1 else modules[0], **kwargs)\n"
               "    return shard(module, **kwargs)\n",
           new="    units = split_by_dtype(module, set(kwargs.get(\"ignored_params\") or ())).values()\n"
               "    root = shard(module, **kwargs)\n"
               "    for modules in units:\n"
               "        shard(modules if len(modules) > 1 else modules[0], **kwargs)\n"
               "    return root\n",
           scenarios=("k2_trainable_mixed_dtypes",),
           caught_by=(Catch(cell="k2_trainable_mixed_dtypes[patched,w2]", status="error", match='Cannot concatenate overlapping meshes'),),
           why="shards the module before its dtype units, so its own unit still holds every dtype"),
    Mutant(name="k_first_module_only", file="by_dtype.py",
           old="        shard(modules if len(modules) > 1 else modules[0], **kwargs)\n",
           new="        shard(modules[0], **kwargs)\n",
           scenarios=("k1_lora_frozen_base",), torch="2.7.1",
           caught_by=(Catch(cell="k1_lora_frozen_base[patched,w2]", status="error", match='uniform original parameter dtype'),),
           why="shards only the first module of a dtype group: lora_b stays beside the bf16 base"),
    Mutant(name="m_force_flag_off", file="gloo_avg.py",
           old="        bound.arguments[_FORCE_SUM] = True\n", new="        bound.arguments[_FORCE_SUM] = False\n",
           scenarios=("gloo_avg_reduce_scatter",), torch="2.8.0",
           caught_by=(Catch(cell="gloo_avg_reduce_scatter[patched,w2]", status="mismatch", match='grad layers.'),),
           why="2.8: passes the force-sum flag as False, so gloo is still asked for AVG"),
    Mutant(name="m_no_division", file="gloo_avg.py",
           old="    return 1.0, float(group.size())\n", new="    return 1.0, 1.0\n",
           scenarios=("gloo_avg_reduce_scatter", "plain"), torch="2.7.1",
           caught_by=(Catch(cell="gloo_avg_reduce_scatter[patched,w2]", status="mismatch", match='grad layers.'), Catch(cell="plain[deployed,w2]", status="mismatch", match='grad layers.'),),
           why="2.7: sums but never divides: grads shard-size times too large"),
    Mutant(name="i_reduce_dtype_only", file="unfreeze.py",
           old="    group._orig_dtype = orig_dtypes.pop()\n", new="",
           scenarios=I_SCENARIOS, caught_by=(Catch(cell="i3_unfreeze_bf16_master_accumulate[patched,w2]", status="error", match='attempting to assign a gradient'),),
           why="resolves the reduce dtype but not the original one: grads are not cast back"),
    Mutant(name="i_orig_dtype_only", file="unfreeze.py",
           old="    group._reduce_dtype = reduce_dtypes.pop()\n", new="",
           scenarios=I_SCENARIOS, caught_by=(Catch(cell="i1_unfreeze_after_first_forward_mp[patched,w2]", status="mismatch", match='grad body.'),),
           why="resolves the original dtype only: the group still reduces in bf16"),
    Mutant(name="i_fill_before_torch", file="unfreeze.py",
           old="    result = init_mp_dtypes(self, *args, **kwargs)\n    fill_frozen_group_dtypes(self)\n",
           new="    fill_frozen_group_dtypes(self)\n    result = init_mp_dtypes(self, *args, **kwargs)\n",
           scenarios=I_SCENARIOS, caught_by=(Catch(cell="i1_unfreeze_after_first_forward_mp[patched,w2]", status="error", match='orig_dtype'),),
           why="fills the group's dtypes before torch resolves (and overwrites) them"),
    Mutant(name="i_probe_inverted", file="unfreeze.py",
           old="    return resolved is None\n", new="    return resolved is not None\n",
           scenarios=I_SCENARIOS, caught_by=(Catch(cell="i1_unfreeze_after_first_forward_mp[patched,w2]", status="error", match='attempting to assign a gradient'),),
           why="inverted feature check: not installed on 2.8 .. 2.13, where it is needed"),
    Mutant(name="i_param_dtype_for_reduce", file="unfreeze.py",
           old="    reduce_dtypes = {p.reduce_dtype for p in floating}\n",
           new="    reduce_dtypes = {p.param_dtype for p in floating}\n",
           scenarios=I_SCENARIOS, caught_by=(Catch(cell="i1_unfreeze_after_first_forward_mp[patched,w2]", status="mismatch", match='grad body.'),),
           why="takes the compute dtype for the reduce dtype: reduces in bf16 again"),
    Mutant(name="o_no_sync", file="finalize.py",
           old="    root.set_requires_gradient_sync(True)  # recurses into every FSDP module under root\n", new="",
           scenarios=("o_moe_reduce_after_window",), world_sizes=(2,),
           caught_by=(Catch(cell="o_moe_reduce_after_window[patched,w2]", status="mismatch", match='presence inp.weight (observed None'),),
           why="runs the post-backward with gradient sync still off: nothing is reduced, grads stay None"),
    Mutant(name="o_sync_root_only", file="finalize.py",
           old="    root.set_requires_gradient_sync(True)  # recurses", new="    root.set_requires_gradient_sync(True, recurse=False)  # recurses",
           scenarios=("o_moe_reduce_after_window",), world_sizes=(2,),
           caught_by=(Catch(cell="o_moe_reduce_after_window[patched,w2]", status="mismatch", match='presence experts.'),),
           why="turns sync back on for the root only: the experts' units are never reduced"),
    Mutant(name="o_no_2_15_mode", file="finalize.py",
           old="        ctx.manual_backward_finalization_active = False\n", new="        pass\n",
           scenarios=("o_moe_reduce_after_window",), torch="2.15.0", world_sizes=(2,),
           caught_by=(Catch(cell="o_moe_reduce_after_window[patched,w2]", status="error", match='manual backward finalization mode'),),
           why="the pre-2.15 code on 2.15: the callback finds no finalization mode and raises"),
    Mutant(name="n_first_rows", file="meta_init.py",
           old="        index = tuple(slice(o, o + n) for o, n in zip(offset, shape))\n",
           new="        index = tuple(slice(0, n) for n in shape)\n",
           scenarios=("n_meta_init_sharded_rng",), world_sizes=(2,),
           caught_by=(Catch(cell="n_meta_init_sharded_rng[patched,w2]", status="mismatch", match='layers.'),),
           why="keeps the first rows of the full init on every rank: rank 1 repeats rank 0's shard"),
    Mutant(name="n_normal_only", file="meta_init.py",
           old='_RANDOM_FILLS = ("uniform_", "normal_")\n', new='_RANDOM_FILLS = ("normal_",)\n',
           scenarios=("n_meta_init_sharded_rng",), world_sizes=(2,),
           caught_by=(Catch(cell="n_meta_init_sharded_rng[patched,w2]", status="mismatch", match='layers.'),),
           why="leaves uniform_ (kaiming_uniform_, nn.Linear's init) drawing per shard"),
    # -- the blind spots of issue 31: each caught only by the scenario or check made for it
    Mutant(name="b_widen_to_first", file="reduce_dtype.py",
           old="    target = widest_float_dtype(g.dtype for g in grads)\n",
           new="    target = grads[0].dtype if widest_float_dtype(g.dtype for g in grads) is not None else None\n",
           scenarios=(*B_SCENARIOS, "b4_mixed_dtype_fresh_grad_first"),
           caught_by=(Catch(cell="b4_mixed_dtype_fresh_grad_first[patched,w2]", status="mismatch", match="grad used."),),
           why="widens a mixed group to its first grad's dtype: right while the accumulated fp32 grad comes first"),
    # No mutant for a bf16 2-norm accumulated in bf16: measured, it lands within one bf16 ulp of
    # the norm accumulated in fp32 on pure_bf16_l2_clip (0.0962 vs 0.0957 at world size 1, both
    # squares summed at once and one by one), which is also how far torch's own clip_grad_norm_
    # is from it (an H200, torch 2.11); the clip is judged to that ulp (harness.train.reference),
    # so such a norm is bf16 rounding, not a mistake this harness can or should flag. A norm off
    # by more than that is caught (tests/test_reference.py).
    Mutant(name="k_compute_dtype", file="by_dtype.py",
           old="        if not _rejected_by_torch(module, ignored, counts_frozen):\n",
           new="        policy = kwargs.get(\"mp_policy\")\n"
               "        if getattr(policy, \"param_dtype\", None) is not None or not _rejected_by_torch(module, ignored, counts_frozen):\n",
           scenarios=("k1_lora_frozen_base", "k2_trainable_mixed_dtypes", "k3_mixed_storage_bf16_compute"),
           caught_by=(Catch(cell="k3_mixed_storage_bf16_compute[patched,w2]", status="error",
                            match="uniform original parameter dtype"),),
           why="reasons from the compute dtype: with a param_dtype set, leaves a unit of mixed storage dtypes whole"),
    Mutant(name="e_flag_never_reset", file="unused_params.py",
           old="    local_used = [bool(vars(p).pop(_USED_ATTR, False)) for p in fsdp_params]\n",
           new="    local_used = [bool(vars(p).get(_USED_ATTR, False)) for p in fsdp_params]\n",
           scenarios=(*E_SCENARIOS, "e_param_used_in_first_step"),
           caught_by=(Catch(cell="e_param_used_in_first_step[patched,w2]", status="mismatch", match="reference None"),),
           why="never resets the 'used in this window' flag: a parameter used once counts as used ever after"),
    Mutant(name="n_first_mesh_dim", file="meta_init.py",
           old="    return isinstance(tensor, DTensor) and any(isinstance(p, Shard) for p in tensor.placements)\n",
           new="    return isinstance(tensor, DTensor) and isinstance(tensor.placements[0], Shard)\n",
           scenarios=("n_meta_init_sharded_rng", "n_meta_init_hsdp"),
           caught_by=(Catch(cell="n_meta_init_hsdp[patched,w4]", status="mismatch", match="layers."),),
           why="reads shardedness from the first mesh dim only: HSDP's (Replicate, Shard) looks unsharded"),
    Mutant(name="f_fallback_over_world", file="_grad_reduce.py",
           old="        backend = group._get_backend(torch.device(device_type))\n",
           new="        backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device(\"cpu\"))\n",
           scenarios=("f_offload_clip_nccl_only", "f_offload_clip_nccl_only_hsdp"),
           caught_by=(Catch(cell="f_offload_clip_nccl_only_hsdp[patched,w4]", status="mismatch", match="grad_norm"),),
           why="reduces through the world's gloo backend, not the shard group's: right only on a 1-D mesh"),
    Mutant(name="k_drops_mesh_and_offload", file="by_dtype.py",
           old="            return call(module, **kwargs)\n",
           new="            return call(module, **{k: v for k, v in kwargs.items() if k not in (\"mesh\", \"offload_policy\")})\n",
           scenarios=("hsdp", "cpu_offload", "mixed_precision"),
           caught_by=(Catch(cell="hsdp[deployed,w4]", status="mismatch", match="sharding:"),
                      Catch(cell="cpu_offload[deployed,w2]", status="mismatch", match="sharding:")),
           why="a fully_shard wrapper that passes the mp policy on but drops mesh and offload: same numbers"),
)


def apply(mutant: Mutant, folder: Path) -> Path:
    """A copy of fsdp_patches under ``folder`` with the one change; its path."""
    target = folder / "fsdp_patches"
    shutil.copytree(PATCHES, target, ignore=shutil.ignore_patterns("__pycache__"))
    path = target / mutant.file
    text = path.read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: the text to change must occur exactly once in {mutant.file}"
    path.write_text(text.replace(mutant.old, mutant.new))
    return target


def run(mutant: Mutant, python: str, folder: Path, timeout_s: float, keep: Path | None = None) -> dict:
    patches = apply(mutant, folder)
    out = folder / "records.jsonl"
    cmd = [python, "-m", "harness", "run", "--patches", str(patches), "--variant", "patched", "--variant",
           "deployed", "--out", str(out), "--quiet", "--timeout", "30"]
    for s in mutant.scenarios:
        cmd += ["--scenario", s]
    own = harness_folder(Path(python).parent.parent)  # where python is a matrix venv's: its bytecode
    env = {**os.environ, **bytecode_env(own)} if own.is_dir() else None
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if keep is not None and out.exists():
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, keep / f"{mutant.name}.jsonl")
    caught = [f"{r['scenario']}[{r['variant']},w{r['world_size']}] {r['status']}" for r in records if not r["as_expected"]]
    named = [r for r in records if any(c.caught(r) for c in mutant.caught_by)]
    state = {0: "survived", 1: "killed" if named else "caught elsewhere"}.get(proc.returncode, "invalid")
    if state == "invalid":
        caught = [(proc.stderr.strip().splitlines() or ["?"])[-1]]
    return {"mutant": mutant.name, "torch": mutant.torch, "state": state, "cells": len(records),
            "caught by": caught, "seconds": round(time.time() - t0, 1), "why": mutant.why}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run only these mutants")
    parser.add_argument("--python-for", action="append", default=[], metavar="TORCH=PYTHON",
                        help="the python whose torch is TORCH (default: this one for 2.13.0)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep each mutant's records here")
    args = parser.parse_args(argv)
    pythons = {DEFAULT_TORCH: sys.executable} | dict(item.split("=", 1) for item in args.python_for)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    rows = []
    for mutant in chosen:
        if mutant.torch not in pythons:
            rows.append({"mutant": mutant.name, "torch": mutant.torch, "state": "not run", "cells": 0,
                         "caught by": [f"no python for torch {mutant.torch} (--python-for)"], "seconds": 0,
                         "why": mutant.why})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run(mutant, pythons[mutant.torch], Path(tmp), args.timeout, args.keep))
        r = rows[-1]
        print(f"{r['mutant']:<28} torch {r['torch']:<7} {r['state']:<8} {r['cells']:>3} cells {r['seconds']:6.1f}s  "
              f"{(r['caught by'] or [''])[0]}", flush=True)
    killed = sum(r["state"] == "killed" for r in rows)
    print(f"\n| mutant | torch | state | caught by (first of {max((len(r['caught by']) for r in rows), default=0)}) "
          "| the mistake |\n|---|---|---|---|---|")
    for r in rows:
        first = r["caught by"][0] if r["caught by"] else ""
        print(f"| {r['mutant']} | {r['torch']} | {r['state']} ({len(r['caught by'])} cells) | {first} | {r['why']} |")
    print(f"\nkill ratio: {killed}/{len(rows)}")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
