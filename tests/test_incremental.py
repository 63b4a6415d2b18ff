"""Incremental reruns (``harness.plan.inputs``, ``harness.launch.incremental``): a cell runs again
exactly when one of its inputs changed, and the verdicts are those of a fresh run."""

import shutil
import subprocess
import sys
from pathlib import Path

from bench.incremental import insert_first
from harness.plan.inputs import PROJECT_ROOT, import_closure
from harness.results.reading import load_records
from harness.results.reusable import carry_over, reusable_records
from harness.train.reuse import FROM_EARLIER_RUN, FROM_LAUNCH
from tests.support import make_record

ROOT = Path(__file__).resolve().parents[1]


def test_a_scenario_depends_on_every_project_file_it_imports_and_nothing_else(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helper.py").write_text("from .deeper import X\n")
    (tmp_path / "pkg" / "deeper.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "unrelated.py").write_text("Y = 2\n")
    (tmp_path / "scenario.py").write_text("import torch\nfrom pkg.helper import X\nfrom harness.spec import Scenario\n")
    found = {p.relative_to(tmp_path).as_posix() for p in import_closure(tmp_path / "scenario.py", [tmp_path],
                                                                        skip=("harness", "torch"))}
    assert found == {"scenario.py", "pkg/__init__.py", "pkg/helper.py", "pkg/deeper.py"}
    project = import_closure(PROJECT_ROOT / "scenarios" / "q_frozen_uint8_param.py", [PROJECT_ROOT], skip=("harness",))
    assert PROJECT_ROOT / "scenarios" / "_models.py" in project


def _run(out: Path, patches: Path, scenarios: Path, *extra: str, exits: tuple[int, ...] = (0,)) -> list:
    cmd = [sys.executable, "-m", "harness", "run", "--quiet", "--out", str(out), "--world-size", "1",
           "--patches", str(patches), "--scenarios-dir", str(scenarios), "--scenario", "plain", "--scenario",
           "q_frozen_uint8_param", "--scenario", "my_pure_bf16", *extra]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode in exits, res.stdout[-2000:] + res.stderr[-2000:]
    records, skipped = load_records([out])
    assert not skipped
    latest = records[-1][0].run_id
    return [r for r, _ in records if r.run_id == latest]


def _ran(records) -> set[tuple[str, str]]:
    return {(r.scenario, r.variant) for r in records if r.reused_from is None}


def _references(records) -> set[str | None]:
    """Where the references of the judged cells that ran came from (None: computed for the cell)."""
    return {r.reference_from for r in records if r.reused_from is None and r.status in ("pass", "mismatch")}


def _verdicts(records) -> dict[tuple[str, str], tuple[str, bool]]:
    return {(r.scenario, r.variant): (r.status, r.as_expected) for r in records}


def test_only_the_cells_whose_inputs_changed_run_again_with_the_fresh_verdicts(tmp_path):
    patches = tmp_path / "my_patches"
    shutil.copytree(ROOT / "fsdp_patches", patches, ignore=shutil.ignore_patterns("__pycache__"))
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    shutil.copy(ROOT / "scenarios" / "pure_bf16.py", scenarios / "my_pure_bf16.py")
    out = tmp_path / "runs.jsonl"

    fresh = _run(out, patches, scenarios)
    everything = _ran(fresh)
    assert len(everything) == len(fresh) >= 7 and all(r.inputs for r in fresh)

    again = _run(out, patches, scenarios)  # nothing changed: nothing runs
    assert _ran(again) == set() and _verdicts(again) == _verdicts(fresh)
    assert all(r.reused_from["run_id"] == fresh[0].run_id for r in again)

    with open(patches / "nonfloat.py", "a") as f:  # a comment in a patch file: no code changed, nothing runs
        f.write("\n# edited\n")
    assert _ran(_run(out, patches, scenarios)) == set()

    # one patch function: exactly the cells that ran it, on any rank, run again
    installing = [r for r in fresh if r.installed_patches]
    assert installing and all(r.code_deps for r in installing)
    some = sorted({d for r in installing for d in r.code_deps if "::" in d and "<module>" not in d
                   and not all(d in x.code_deps for x in installing)})
    target = "grads.py::clip_grad_norm_"  # the deployed cells that clip run it; the others do not
    assert target in some, some
    insert_first(patches / target.split("::")[0], target.split("::")[1], "_edited = None")
    after_patch = _run(out, patches, scenarios)
    assert _ran(after_patch) == {(r.scenario, r.variant) for r in installing if target in r.code_deps}
    assert _verdicts(after_patch) == _verdicts(fresh)
    # their FSDP2 side produced what it did before: their references are those the fresh run kept
    assert _references(after_patch) and _references(after_patch) <= {FROM_EARLIER_RUN, FROM_LAUNCH}
    assert FROM_EARLIER_RUN in _references(after_patch) and FROM_EARLIER_RUN not in _references(fresh)

    with open(scenarios / "my_pure_bf16.py", "a") as f:  # one scenario file: its cells only
        f.write("\n# edited\n")
    after_scenario = _run(out, patches, scenarios)
    assert _ran(after_scenario) == {(s, v) for s, v in everything if s == "my_pure_bf16"}
    assert _verdicts(after_scenario) == _verdicts(fresh)
    assert FROM_EARLIER_RUN not in _references(after_scenario)  # a reference depends on its scenario's files

    # that function broken: the cells that ran it get what a fresh run of the broken module gives
    insert_first(patches / target.split("::")[0], target.split("::")[1], "raise RuntimeError('broken here')")
    broken = _run(out, patches, scenarios, exits=(1,))  # 1: cells not as expected
    broken_fresh = _run(tmp_path / "broken-fresh.jsonl", patches, scenarios, "--fresh", exits=(1,))
    assert _verdicts(broken) == _verdicts(broken_fresh) != _verdicts(fresh)
    assert _ran(broken) == {(r.scenario, r.variant) for r in installing if target in r.code_deps}
    (patches / target.split("::")[0]).write_text((ROOT / "fsdp_patches" / target.split("::")[0]).read_text())

    options = _run(out, patches, scenarios, "--timeout", "45")  # a run option: every cell
    assert _ran(options) == everything
    again_fresh = _run(out, patches, scenarios, "--timeout", "45", "--fresh")
    assert _ran(again_fresh) == everything and FROM_EARLIER_RUN not in _references(again_fresh)


def test_a_record_not_as_expected_or_of_a_hang_is_never_reused(tmp_path):
    out = tmp_path / "r.jsonl"
    rows = [make_record(scenario="a", inputs="k1", status="pass", as_expected=True),
            make_record(scenario="b", inputs="k2", status="mismatch", as_expected=False),
            make_record(scenario="c", inputs="k3", status="hang", expected=("hang",), as_expected=True),
            make_record(scenario="d", inputs="k4", status="pass", as_expected=True),
            make_record(scenario="d", inputs="k4", status="mismatch", as_expected=False)]
    out.write_text("".join(r.to_json() + "\n" for r in rows))
    assert set(reusable_records(out)) == {"k1"}


def test_what_a_replaced_records_file_carries_over_is_the_newest_reusable_of_it_and_the_last_carry(tmp_path):
    out = tmp_path / "torch-2.13.0.jsonl"
    previous = tmp_path / "torch-2.13.0.jsonl.previous"
    older = [make_record(scenario="a", inputs="k1", status="pass", as_expected=True),
             make_record(scenario="b", inputs="k2", status="pass", as_expected=True)]
    previous.write_text("".join(r.to_json() + "\n" for r in older))
    newer = [make_record(scenario="b", inputs="k2", status="mismatch", as_expected=False),  # k2 failed since
             make_record(scenario="c", inputs="k3", status="pass", as_expected=True),
             make_record(scenario="d", inputs="k4", status="hang", expected=("hang",), as_expected=True)]
    out.write_text("".join(r.to_json() + "\n" for r in newer))
    assert carry_over(out) == previous and set(reusable_records(previous)) == {"k1", "k3"}
    assert [p.name for p in tmp_path.glob("*.jsonl")] == [out.name]  # the report's search finds only the records
    out.write_text(newer[0].to_json() + "\n")
    previous.unlink()
    assert carry_over(out) is None and not previous.exists()  # nothing reusable: no file


def test_a_carried_over_file_keeps_the_newest_keys_of_each_cell_and_copies_their_lines(tmp_path):
    """Each change of the harness or torch gives every cell a new key: the carry keeps the
    newest ``KEYS_PER_CELL`` of a cell instead of growing by a whole run each time."""
    from harness.results.reusable import KEYS_PER_CELL

    out = tmp_path / "torch-2.13.0.jsonl"
    other = make_record(scenario="b", inputs="b1", status="pass", as_expected=True)
    for i in range(KEYS_PER_CELL + 2):
        rows = [make_record(scenario="a", inputs=f"a{i}", status="pass", as_expected=True)] + ([other] if i == 0 else [])
        out.write_text("".join(r.to_json() + "\n" for r in rows))
        previous = carry_over(out)
    newest = {f"a{i}" for i in range(2, KEYS_PER_CELL + 2)}
    assert set(reusable_records(previous)) == newest | {"b1"}
    assert other.to_json() in previous.read_text().splitlines()  # copied as written
    out.write_text(make_record(scenario="a", inputs="a2", status="mismatch", as_expected=False).to_json() + "\n")
    assert set(reusable_records(carry_over(out))) == newest - {"a2"} | {"b1"}  # its newest record failed


def test_a_rerun_reuses_the_records_of_the_file_it_replaces(tmp_path):
    """``nox -s matrix`` replaces a version's records file; what it held is carried over and reused."""
    scenarios, out = tmp_path / "scenarios", tmp_path / "torch.jsonl"
    scenarios.mkdir()
    shutil.copy(ROOT / "scenarios" / "pure_bf16.py", scenarios / "my_pure_bf16.py")
    first = _run(out, ROOT / "fsdp_patches", scenarios)
    previous = carry_over(out)
    out.unlink()
    again = _run(out, ROOT / "fsdp_patches", scenarios, "--reuse-from", str(previous), "--world-size", "2")
    always = {(r.scenario, r.variant) for r in first if r.status in ("hang", "crash")}
    assert _ran(first) == set(_verdicts(first)) and len(always) < len(first)
    w1 = [r for r in again if r.world_size == 1]
    assert {(r.scenario, r.variant) for r in w1 if r.reused_from is None} == always and _verdicts(w1) == _verdicts(first)
    assert {r.world_size for r in again if r.reused_from is None} >= {2}  # a launch beside the reused: new cells


def test_the_key_sees_the_settings_torch_and_the_harness_read_from_the_environment(monkeypatch):
    from harness.plan.cells import Cell
    from harness.plan.inputs import CellInputs
    from harness.undertest.source import locate

    cell = Cell(index=0, scenario="plain", variant="vanilla", device="cpu", backend="gloo", world_size=2, mesh=(2,),
                timeout_s=60.0)

    def key():
        return CellInputs(scenario_files={}, source=locate("fsdp_patches")).key(cell)

    for name in ("FSDP_COMPAT_LEDGER", "TORCH_DISTRIBUTED_DEBUG", "PYTHONHASHSEED", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    first = key()
    monkeypatch.setenv("FSDP_COMPAT_UNRELATED", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert key() == first
    for name, value in (("FSDP_COMPAT_LEDGER", "0"), ("TORCH_DISTRIBUTED_DEBUG", "DETAIL"), ("PYTHONHASHSEED", "0"),
                        ("OMP_NUM_THREADS", "2")):
        monkeypatch.setenv(name, value)
        assert key() != first, name
        monkeypatch.delenv(name)
    assert key() == first


def test_a_references_inputs_leave_out_the_module_under_test_and_the_cells_options(tmp_path):
    from harness.plan.cells import Cell
    from harness.plan.inputs import CellInputs
    from harness.undertest.source import locate

    scenario = tmp_path / "mine.py"
    scenario.write_text("X = 1\n")

    def keys(module="fsdp_patches", **changes):
        cell = Cell(**{**dict(index=0, scenario="mine", variant="vanilla", device="cpu", backend="gloo", world_size=2,
                              mesh=(2,), timeout_s=60.0), **changes})
        inputs = CellInputs(scenario_files={"mine": scenario}, source=locate(module))
        return inputs.reference_inputs(cell), inputs.key(cell)

    ref, key = keys()
    for changes in (dict(variant="deployed", patches=("p",)), dict(timeout_s=9.0), dict(patches=("p",))):
        assert keys(**changes)[0] == ref and keys(**changes)[1] != key, changes
    pkg = tmp_path / "theirs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def patch_x():\n    pass\n")
    assert keys(str(pkg), patches=("x",))[0] == ref
    scenario.write_text("X = 2\n")
    assert keys()[0] != ref


def test_the_module_key_sees_its_folder_but_not_its_probed_code(tmp_path):
    from harness.plan.inputs import CellInputs
    from harness.undertest.source import locate

    pkg = tmp_path / "mypatches"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .impl import patch_x\n")
    (pkg / "impl.py").write_text("def patch_x():\n    return None\n")

    def key():
        return CellInputs(scenario_files={}, source=locate(str(pkg))).module_digest

    first = key()
    (pkg / "impl.py").write_text("def patch_x():\n    return 1\n")  # probed code: the record's code_deps judge it
    assert key() == first
    (pkg / "table.json").write_text("{}")  # data it may read
    with_data = key()
    assert with_data != first
    (pkg / "table.json").write_text('{"a": 1}')
    assert key() != with_data
    (pkg / "table.json").unlink()
    (pkg / "_fast.py").write_text("X = 1\n")  # a file a try/except import or a lazy __getattr__ may find
    assert key() != first


def test_the_least_wall_is_the_no_change_run_and_the_edits_share_of_the_rest_of_the_fresh_run():
    from bench.incremental import least_wall

    fresh = [{"duration_s": 1.0}, {"duration_s": 3.0}, {"duration_s": None}, {"duration_s": 4.0}]
    share, least = least_wall(5.0, 45.0, fresh[:2], fresh)
    assert share == 0.5 and least == 5.0 + 0.5 * 40.0
    assert least_wall(5.0, 45.0, [], fresh) == (0.0, 5.0)
    assert least_wall(5.0, 45.0, fresh, fresh) == (1.0, 45.0)


def test_each_patch_functions_edit_is_priced_by_the_cells_that_ran_it():
    from bench.incremental import by_function, every_function

    work = [{"duration_s": 2.0, "code_deps": {"a.py::f": "1", "a.py::<module>": "2", "a.py::g": "3"}},
            {"duration_s": 6.0, "code_deps": {"a.py::g": "3"}}, {"duration_s": 2.0, "code_deps": None}]
    ran = by_function(work)
    assert {fid: len(cells) for fid, cells in ran.items()} == {"a.py::f": 1, "a.py::g": 2}
    table = every_function(5.0, 45.0, work)
    # g: 80% of the cell work -> 5 + 0.8 * 40 = 37 s (82%); f: 20% -> 13 s (29%)
    assert "within 35% of the fresh wall for 1, median 82%" in table
    assert "| `a.py::g` | 2 | 80% | 37.0 s (82%) |" in table and "| `a.py::f` | 1 | 20% | 13.0 s (29%) |" in table
    assert every_function(5.0, 45.0, work[2:]).startswith("no patch function")

