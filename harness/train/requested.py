"""Did every parameter get the sharding the scenario asked for? Checked in every cell after
training (FSDP2 sets the dtypes at its first forward): a patch that wraps ``fully_shard`` and
drops its mesh or offload policy trains to the same numbers (HSDP run as plain FSDP, offload
off) and only this check sees it.

Per parameter, from FSDP2's own bookkeeping (``FSDPParam``): the mesh's shape (the cell's, or
its "dp" part under tensor parallelism), the placements (``Shard`` on the shard dim, and
``Replicate`` on HSDP's replicate dim), CPU offload on or off, and the compute dtype where the
scenario sets ``param_dtype`` (unless a ``param_dtype_override_fn`` chooses per parameter).
And the collectives agree with those meshes: every all-gather and reduce-scatter of the
forward and backward (the ledger, ``harness.train.ledger``) runs over a group the size of a
parameter's shard mesh dim (or of the tensor-parallel dim), so a patch that swaps the group
FSDP2 reduces over is named even where the meshes are right.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from harness.plan.cells import Cell
from harness.scenario.spec import Scenario

__all__ = ["sharding_problems"]


def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            groups = [g] if (g := getattr(state, "_fsdp_param_group", None)) is not None else []
        for group in groups:
            yield from group.fsdp_params


def sharding_problems(model: nn.Module, scenario: Scenario, cell: Cell, ledger: list[list[Any]] | None = None) -> list[str]:
    """One line per parameter and field that differs from what the scenario asked for, and one
    per collective of ``ledger`` (its rows) over a group no mesh dim has."""
    s = scenario.sharding
    names = {id(p): n for n, p in model.named_parameters()}
    mesh = (cell.mesh[0],) if s.tp > 1 else tuple(cell.mesh)
    kinds = ("Shard",) if len(mesh) == 1 else ("Replicate", "Shard")
    compute = None if "param_dtype_override_fn" in s.mp_fields else s.mp_fields.get("param_dtype", s.param_dtype)
    problems: list[str] = []
    shard_sizes = {s.tp} if s.tp > 1 else set()
    for fp in _fsdp_params(model):
        shard_sizes.add(getattr(fp.mesh_info, "shard_mesh_size", None) or fp.mesh_info.mesh.shape[-1])
        name = names.get(id(fp.sharded_param), "?")
        got_mesh = tuple(fp.mesh_info.mesh.shape)
        if got_mesh != mesh:
            problems.append(f"{name} mesh {got_mesh}, requested {mesh}")
        got = tuple(type(p).__name__ for p in getattr(fp.sharded_param, "placements", ()))
        if s.tp == 1 and got != kinds:
            problems.append(f"{name} placements {got}, requested {kinds}")
        if bool(getattr(fp, "offload_to_cpu", False)) != s.offload:
            problems.append(f"{name} offload {'on' if fp.offload_to_cpu else 'off'}, requested "
                            f"{'on' if s.offload else 'off'}")
        orig = getattr(fp, "orig_dtype", None)
        if compute is not None and orig is not None and (getattr(fp, "param_dtype", None) or orig) != compute:
            problems.append(f"{name} computes in {_short(getattr(fp, 'param_dtype', None) or orig)}, requested "
                            f"{_short(compute)}")
    for step, _mb, phase, kind, group, dtype, count, _bytes in ledger or []:
        if phase in ("forward", "backward") and kind in ("all_gather", "reduce_scatter") and group not in shard_sizes:
            problems.append(f"step {step} {phase}: {count} {kind}(s) of {dtype} over a group of {group} ranks, "
                            f"the shard group has {' or '.join(map(str, sorted(x for x in shard_sizes if x)))}")
    return problems


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
