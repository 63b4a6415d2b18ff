import pytest

from harness.envs.matrix import load_matrix, parse_matrix
from tests.support import ROOT


def test_committed_matrix_is_valid_and_has_the_default_cpu_set():
    m = load_matrix(ROOT / "matrix.yaml")
    cpu = m.device("cpu")
    assert cpu.torch == ("2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
    assert ("2.13.0", "cpu") in m.cells()


GOOD = {"patches": "fsdp_patches", "devices": {"cpu": {"torch": ["2.13.0"]}}}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"devices": {"tpu": {"torch": ["2.13.0"]}}}, "unknown device 'tpu'"),
        ({"devices": {"cpu": {"torch": ["2.13"]}}}, "devices.cpu.torch: bad version '2.13'"),
        ({"devices": {"cpu": {"torch": [2.13]}}}, "bad version 2.13"),
        ({"devices": {"cpu": {"torch": []}}}, "devices.cpu.torch must be a non-empty list"),
        ({"devices": {"cpu": {"torch": ["2.13.0"], "backend": "x"}}}, "devices.cpu: unknown key 'backend'"),
        ({"world_sizes": [0, 2]}, "'world_sizes' must be a non-empty list of positive integers"),
        ({"timeout_s": -1}, "'timeout_s' must be a finite number of seconds > 0, got -1"),
        ({"timeout_s": float("inf")}, "'timeout_s' must be a finite number of seconds > 0, got inf"),
        ({"timeout_s": float("nan")}, "'timeout_s' must be a finite number of seconds > 0, got nan"),
        ({"world_sizes": [3]}, "'world_sizes': no scenario supports world size 3 (supported: 1, 2, 4)"),
        ({"devices": {"cpu": {"torch": ["2.13.0"], "world_sizes": [8]}}}, "devices.cpu.world_sizes: no scenario supports"),
        ({"scenarios": ["plain", "plian"]}, "'scenarios': unknown scenario 'plian'"),
        ({"scenarios": "some"}, "'scenarios' must be 'all' or a non-empty list"),
        ({"patch_map": ["x"]}, "'patch_map' must map patch names"),
        ({"devices": {"cpu": {"torch": ["2.13.0", "2.13.0"]}}}, "lists a version twice"),
    ],
)
def test_bad_fields_are_named_in_one_line(change, message):
    with pytest.raises(ValueError) as err:
        parse_matrix({**GOOD, **change})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_device_overrides_and_scenario_list():
    m = parse_matrix({**GOOD, "scenarios": ["plain"], "world_sizes": [2],
                      "devices": {"cpu": {"torch": ["2.13.0"], "world_sizes": [1], "timeout_s": 5}}})
    assert m.scenarios == ("plain",)
    assert m.device("cpu").world_sizes == (1,) and m.device("cpu").timeout_s == 5.0


def test_a_key_given_twice_is_refused(tmp_path):
    dup = tmp_path / "m.yaml"
    dup.write_text("patches: fsdp_patches\ntimeout_s: 5\ntimeout_s: 6\ndevices:\n  cpu:\n    torch: ['2.13.0']\n")
    with pytest.raises(ValueError, match=r"^m.yaml: key 'timeout_s' given twice \(lines 2 and 3\)$"):
        load_matrix(dup)


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("devices: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_matrix(bad)
    with pytest.raises(ValueError, match="matrix file not found"):
        load_matrix(tmp_path / "nope.yaml")


def test_nox_json_list_names_every_matrix_cell():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "nox", "--json", "-l"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = {s["session"] for s in json.loads(out.stdout)}
    assert "matrix(torch='2.12.1', device='cpu')" in names and "tests" in names


def test_a_bad_matrix_stops_nox_with_one_line_and_exit_2(tmp_path):
    import shutil
    import subprocess
    import sys

    for name in ("noxfile.py", "harness", "scenarios", "fsdp_patches"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    text = (ROOT / "matrix.yaml").read_text().replace("timeout_s: 60", "timeout_s: 60\ntimeout_s: .inf", 1)
    (tmp_path / "matrix.yaml").write_text(text)
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: matrix.yaml: key 'timeout_s' given twice (lines ")


def test_torch_free_catalog_names_exactly_the_loaded_scenarios(tmp_path):
    """matrix.yaml's scenario list is checked against the catalog: it must name what loading finds,
    and a ``name=`` given to another call (``PublicApi(name=...)``) names no scenario."""
    from harness.scenario.load import load_scenarios
    from harness.scenario.scan import read_catalog

    assert read_catalog().names == set(load_scenarios().scenarios)
    (tmp_path / "x_api.py").write_text(
        'API = PublicApi(name="FSDPModule.set_x", since="2.8")\nSCENARIO = Scenario(model=M, batch=b, api=API)\n')
    (tmp_path / "y_named.py").write_text('SCENARIO = Scenario(name="y_other", model=M, batch=b)\n')
    assert read_catalog(tmp_path).names == {"x_api", "y_other"}
