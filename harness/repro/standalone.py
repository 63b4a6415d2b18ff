#!/usr/bin/env python
"""Standalone reproduction of one fsdp-compat cell; needs only torch.

This file is the program ``harness.repro.export`` writes: it is read as text, the two lines
``HEADER = {}`` and ``SOURCES = {}`` below are filled in, and the result is saved as the
exported script. ``SOURCES`` carries the harness code the cell needs (training recipe,
reference, comparison, patch installing), the scenario file and its helpers, and for a
patched cell the patches module, all loaded from memory. Under ``torchrun`` (or as one
process at world size 1) it trains the cell with FSDP2 (``fully_shard``), replays the
same training in one process without torch.distributed (grads = sum over micro-batches
of the mean over ranks), and prints expected vs observed.
"""

import datetime
import importlib
import importlib.abc
import importlib.util
import os
import sys
import traceback

HEADER = {}  # filled by harness.repro.export
SOURCES = {}  # filled by harness.repro.export


class _Embedded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=SOURCES[name][1])
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source, is_package = SOURCES[module.__name__]
        if is_package:
            module.__path__ = []
        exec(compile(source, "<" + module.__name__ + ">", "exec"), module.__dict__)


def _packaging_fallback():
    """Expectations are precomputed in HEADER; only the names must import."""
    if importlib.util.find_spec("packaging") is not None:
        return
    SOURCES["packaging"] = ("", True)
    SOURCES["packaging.version"] = ("from torch._vendor.packaging.version import *  # noqa", False)
    SOURCES["packaging.specifiers"] = (
        "class InvalidSpecifier(ValueError):\n    pass\n"
        "class SpecifierSet:\n    def __init__(self, spec=''):\n        self.spec = spec\n"
        "    def __contains__(self, item):\n        return False\n",
        False,
    )


def main():
    _packaging_fallback()
    sys.meta_path.insert(0, _Embedded())
    import torch
    import torch.distributed as dist

    from harness.plan.cells import Cell
    from harness.scenario.load import named_scenarios
    from harness.train import fsdp as fsdp_run
    from harness.train.compare import compare_runs
    from harness.train.reference import quirks_for, run_reference

    module = importlib.import_module(HEADER["module"])
    scenario = next(s for s in named_scenarios(module, HEADER["stem"]) if s.name == HEADER["scenario"])
    cell = Cell.from_dict(HEADER["cell"])
    if cell.variant == "api":
        scenario = scenario.with_api()
    if "RANK" not in os.environ:
        if cell.world_size != 1:
            sys.exit(f"run with: torchrun --standalone --nproc-per-node {cell.world_size} {sys.argv[0]}")
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cell.world_size:
        sys.exit(f"this cell needs world size {cell.world_size}, got {world}")
    if cell.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(cell.backend, timeout=datetime.timedelta(seconds=cell.timeout_s))
    utilities = _install_patches(cell)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"torch {torch.__version__}; cell {scenario.name} [{cell.variant}, {cell.device}/{cell.backend}, "
        f"world size {world}]")
    say(f"EXPECTED (fsdp-compat, torch {HEADER['exported_with_torch']}): {'|'.join(cell.expected)}"
        + (f" with '{cell.expected_match}'" if cell.expected_match else "")
        + "; correct behaviour: grads equal the single-process reference")
    try:
        observed = fsdp_run.train(scenario, cell, utilities, rank, world)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"[rank {rank}] OBSERVED: {type(e).__name__}: {first}", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    code = 0
    if rank == 0:
        quirks = quirks_for(torch_version=torch.__version__, backend=cell.backend, sharding=scenario.sharding,
                            reduction_sums=observed[0].reduction_sums if observed else None) \
            if scenario.reference_quirks else []
        reference = run_reference(scenario, world, quirks=quirks)
        result = compare_runs(observed, reference)
        print(f"OBSERVED: {'pass' if result.ok else 'mismatch'} against the single-process reference")
        print(f"{'step':>4}  {'kind':<9} {'parameter':<28} {'max abs':>10}  ok   note")
        for d in sorted(result.diffs, key=lambda d: -d.score)[:20]:
            shown = "-" if d.max_abs is None else f"{d.max_abs:.3e}"
            print(f"{d.step:>4}  {d.kind:<9} {d.name:<28} {shown:>10}  {'yes' if d.ok else 'NO ':<3}  {d.note}")
        code = 0 if result.ok else 1
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(code)


def _install_patches(cell):
    """The harness's own patch installing (``harness.undertest.install``), with the exported mapping."""
    if cell.variant == "vanilla" or not cell.patches:
        return {}
    from harness.undertest.install import install_set

    module = importlib.import_module(HEADER["patches_import"])
    installs, utilities = install_set(module, list(cell.patches), HEADER["patch_mapping"])
    for name, entry in installs.items():
        print(f"patch {name}: {entry['status']}" + (f" ({entry['reason']})" if entry["reason"] else ""))
    return utilities


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
