"""The requested-sharding check (``harness.train.requested``): each parameter's mesh, placements,
offload and compute dtype against the scenario, and the ledger's groups against the meshes."""

import json
import subprocess
import sys
import textwrap

from tests.support import ROOT

_SCRIPT = textwrap.dedent('''
    import datetime, json, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    from harness.plan.cells import Cell
    from harness.spec import Scenario, Sharding
    from harness.train.requested import sharding_problems
    from scenarios._models import MLP, randn_batch

    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    cell = Cell(index=0, scenario="s", variant="vanilla", device="cpu", backend="gloo", world_size=1,
                mesh=(1,), timeout_s=30)
    asked = Scenario(model=MLP, batch=randn_batch(), sharding=Sharding(offload=True))
    out = {}
    model = MLP()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)), offload_policy=CPUOffloadPolicy(pin_memory=False))
    out["as_asked"] = sharding_problems(model, asked, cell, ledger=[[0, 0, "forward", "all_gather", 1, "float32", 1, 4]])
    out["foreign_group"] = sharding_problems(model, asked, cell, ledger=[[0, 0, "backward", "reduce_scatter", 2, "float32", 3, 12]])
    out["outside_the_step"] = sharding_problems(model, asked, cell, ledger=[[0, 0, "clip", "all_gather", 2, "float32", 1, 4]])
    plain = MLP()
    fully_shard(plain, mesh=init_device_mesh("cpu", (1,)))
    out["offload_dropped"] = sharding_problems(plain, asked, cell)
    print("RESULT" + json.dumps(out))
    dist.destroy_process_group()
''')


def test_what_differs_from_the_request_is_named(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "store")], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT"):])
    assert out["as_asked"] == [] and out["outside_the_step"] == []
    assert out["foreign_group"] == ["step 0 backward: 3 reduce_scatter(s) of float32 over a group of 2 ranks, "
                                    "the shard group has 1"]
    assert out["offload_dropped"] and all(p.endswith("offload off, requested on") for p in out["offload_dropped"])
