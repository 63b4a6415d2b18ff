"""Running the public stacks (``stacks/``): fetch each stack's wheel, then judge each of its
patch functions on the torch installed here.

``python -m harness stacks fetch`` downloads and unpacks every stack (without dependencies;
needs pip and the package index; a stack that cannot be fetched is one line and is skipped).
``python -m harness stacks run`` runs, for every fetched stack and every ``Judged`` function,
the vanilla and patched cells of its scenarios with the stack's entry module as the patches
module under test and ``--patch-map PATCH=SHIM``; records go to
``<out>/<stack>/<judged key>/torch-<release>.jsonl``. A function that cannot be judged on this
device is one line saying why (the report shows the reason). ``nox -s stacks`` does both for
every CPU torch version of ``matrix.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from harness.undertest.stacks import CACHE_ENV, DEFAULT_CACHE, STACKS_DIR, Judged, Stack, fetch, load_stacks, unpacked

__all__ = ["STACKS_DIR", "fetch_all", "records_path", "run_all"]


def fetch_all(folder: Path = STACKS_DIR, cache: Path = DEFAULT_CACHE, say: Callable[[str], object] = print) -> int:
    """Fetch every stack; the number that could not be fetched (each said in one line)."""
    missed = 0
    for stack in load_stacks(folder):
        problem = fetch(stack, cache)
        say(f"skip {problem}" if problem else f"{stack.label}: ready in {unpacked(stack, cache)}")
        missed += problem is not None
    return missed


def records_path(out: Path, stack: Stack, judged: Judged, release: str) -> Path:
    return out / stack.name / judged.key / f"torch-{release}.jsonl"


def run_all(out: Path, *, folder: Path = STACKS_DIR, cache: Path = DEFAULT_CACHE, device: str = "cpu",
            only: list[str] | None = None, say: Callable[[str], object] = print) -> int:
    """Judge every fetched stack's functions here (cells not as expected are said, and are verdicts)."""
    import torch

    from harness.launch.pipeline import run
    from harness.runconfig import RunConfig
    from harness.versions import release_label

    os.environ[CACHE_ENV] = str(Path(cache).resolve())  # the workers' shims find the stacks here
    release = release_label(torch.__version__)
    unexpected = 0
    for stack in load_stacks(folder):
        if only and stack.name not in only:
            continue
        if not (unpacked(stack, cache) / ".complete").exists():
            say(f"skip {stack.label}: not fetched (python -m harness stacks fetch)")
            continue
        for judged in stack.judged:
            if device == "cpu" and judged.cpu:
                say(f"{stack.label} {judged.function}: not applicable on CPU ({judged.cpu})")
                continue
            path = records_path(out, stack, judged, release)
            # api: where a scenario has a public API, the report can say "use public API"
            config = RunConfig(scenarios=list(judged.scenarios), devices=[device], variants=["vanilla", "patched", "api"],
                               patches=stack.module, patch_mapping={judged.patch: judged.shim}, out=path)
            result = run(config)
            bad = [r for r in result.records if not r.as_expected]
            unexpected += len(bad)
            say(f"{stack.label} {judged.function} on torch {release}: {len(result.records)} cells -> {path}"
                + (f"; not as expected: {', '.join(f'{r.scenario}[{r.variant},w{r.world_size}]' for r in bad)}"
                   if bad else ""))
    return 0  # a patched cell not as expected is the verdict "broken", for the report to say
