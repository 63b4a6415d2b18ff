"""Import, in one process, what a launch's processes import, so a fresh venv's bytecode is
written once before its ranks start.

uv installs packages without bytecode. Run under ``harness.envs.session.bytecode_env`` (the
venv's own bytecode folder, writing allowed), this writes the bytecode of every module it
imports: torch and its distributed stack, the harness's launcher and per-rank modules, the
modules a patch may touch (``harness.undertest.undo.preload``), dynamo (FSDP2 imports it on
first use) and every scenario's ``requires`` (transformers' model modules). Without it the
ranks of the first launch compile the same modules at the same time, each for itself;
compiling the whole site-packages instead walks thousands of modules no cell imports.

    python -m harness.envs.warm [SCENARIOS_DIR ...]
"""

from __future__ import annotations

import importlib
import sys
import time

__all__ = ["main", "warm"]


def warm(scenario_dirs: list[str]) -> tuple[int, list[str]]:
    """Import what the launch's processes import; (modules now loaded, requirements that failed)."""
    import harness.cli  # noqa: F401 (the launcher's process)
    from harness.rank.worker import import_requirements  # torch, torch.distributed, the per-rank modules
    from harness.scenario.load import load_scenarios
    from harness.undertest.undo import preload

    preload()
    importlib.import_module("torch._dynamo")
    scenarios = load_scenarios(scenario_dirs).scenarios.values()
    failed = import_requirements(name for scenario in scenarios for name in scenario.requires)
    return len(sys.modules), sorted(failed)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    loaded, failed = warm(list(sys.argv[1:] if argv is None else argv))
    missing = f"; not importable here: {', '.join(failed)}" if failed else ""
    print(f"warm: {loaded} modules imported in {time.perf_counter() - t0:.1f} s{missing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
