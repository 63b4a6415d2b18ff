"""Public stacks: entries as data, a stack's functions loaded by path, fetching that fails in one
line, and a stack judged end to end into the report's Public stacks rows."""

import textwrap

import pytest

from harness.undertest.extract import load_functions
from harness.undertest.stacks import CACHE_ENV, STACKS_DIR, Stack, fetch, load_stacks, unpacked

STACK_FILE = textwrap.dedent('''
    from __future__ import annotations

    import math
    import no_such_package_here          # the rest of the stack: never imported
    from no_such_package_here.log import get_logger

    LOG = get_logger(__name__)
    LIMIT = 3

    def _helper(x):
        return math.sqrt(x) + LIMIT

    def shipped(x):
        LOG.info("called")
        return _helper(x)

    def needs_it():
        return no_such_package_here.value
''')


def test_a_function_is_loaded_with_what_it_reaches_and_nothing_else(tmp_path):
    import logging

    path = tmp_path / "stack_file.py"
    path.write_text(STACK_FILE)
    module = load_functions(path, ("shipped",), module_name="m", provide={"LOG": logging.getLogger("stack")})
    assert module.shipped(4.0) == 5.0
    assert not hasattr(module, "needs_it") and not hasattr(module, "no_such_package_here")
    with pytest.raises(ValueError, match="needs_it needs no_such_package_here, which this environment lacks"):
        load_functions(path, ("needs_it",), module_name="m")
    with pytest.raises(ValueError, match="shipped needs no_such_package_here"):  # LOG not provided: its import is needed
        load_functions(path, ("shipped",), module_name="m")
    with pytest.raises(ValueError, match="no top-level absent"):
        load_functions(path, ("absent",), module_name="m")


def test_every_entry_names_scenarios_that_name_its_patch_and_a_shim_it_has():
    import importlib.util

    from harness.scenario.load import load_scenarios

    library = load_scenarios().scenarios
    stacks = load_stacks(STACKS_DIR)
    assert len(stacks) >= 4
    for stack in stacks:
        spec = importlib.util.spec_from_file_location(f"_entry_{stack.name}", stack.module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for judged in stack.judged:
            assert callable(getattr(module, judged.shim, None)), (stack.label, judged.shim)
            for name in judged.scenarios:
                assert judged.patch in library[name].patches, (stack.label, name, judged.patch)


def test_a_stack_that_cannot_be_fetched_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    stack = Stack(name="nothing", version="0.0.1", dist="fsdp-compat-no-such-stack", judged=())
    line = fetch(stack, tmp_path / "cache")
    assert line is not None and line.startswith("nothing 0.0.1: cannot fetch fsdp-compat-no-such-stack==0.0.1 (")
    assert "\n" not in line and not (unpacked(stack, tmp_path / "cache") / ".complete").exists()


ENTRY = textwrap.dedent('''
    from harness.undertest.stacks import Judged, Stack, StackCode

    STACK = Stack(name="mini", version="1.0", dist="mini", judged=(
        Judged(function="safe_clip", where="mini/clip.py", bugs="H", patch="clip_grad_norm", shim="clip_",
               scenarios=("h_inf_norm_empty_shard",)),
        Judged(function="gpu_clip", where="mini/clip.py", bugs="F", patch="clip_grad_norm", shim="clip_",
               scenarios=("h_inf_norm_empty_shard",), cpu="asks for the current CUDA device"),
    ))
    _CODE = StackCode(STACK, "mini/clip.py", ("safe_clip",))

    def clip_(parameters, max_norm, norm_type=2.0):
        return _CODE.safe_clip(parameters, max_norm, norm_type)
''')

SHIPPED = textwrap.dedent('''
    import fsdp_patches
    import mini.config  # the stack's own package: not needed by safe_clip

    def safe_clip(parameters, max_norm, norm_type):
        return fsdp_patches.clip_grad_norm_(parameters, max_norm, norm_type)
''')


@pytest.mark.slow
def test_a_stack_is_judged_end_to_end_into_the_public_stacks_rows(tmp_path, monkeypatch):
    """A fetched stack whose function is the project's offload-safe clip: H's cells say it is
    needed on this torch; the function declared unfit for CPU is said so, with its reason."""
    import torch

    from harness.launch.stacks import run_all
    from harness.results.stacks import NOT_ON_CPU, stack_rows
    from harness.versions import release_label

    folder, cache, out = tmp_path / "stacks", tmp_path / "cache", tmp_path / "runs"
    folder.mkdir()
    (folder / "mini.py").write_text(ENTRY)
    stack = load_stacks(folder)[0]
    shipped = unpacked(stack, cache) / "mini" / "clip.py"
    shipped.parent.mkdir(parents=True)
    shipped.write_text(SHIPPED)
    (unpacked(stack, cache) / ".complete").write_text("test\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_ENV, str(cache))  # run_all sets it for the workers; put back after the test
    said: list[str] = []
    assert run_all(out, folder=folder, cache=cache, say=said.append) == 0
    assert said[1] == "mini 1.0 gpu_clip: not applicable on CPU (asks for the current CUDA device)", said
    release = release_label(torch.__version__)
    table, details, notes = stack_rows(out, [stack])
    rows = table.set_index("function")
    assert rows.loc["safe_clip", release] == "needed", details.to_dict("records")
    assert "h_inf_norm_empty_shard w2" in details.set_index("function").loc["safe_clip", release]
    assert rows.loc["gpu_clip", release] == NOT_ON_CPU
    assert notes == [f"mini 1.0 gpu_clip: {NOT_ON_CPU}: asks for the current CUDA device."]
