import os

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
        ({"devices": {"cpu": {"torch": ["2.13.0"], "slots": 0}}}, "devices.cpu.slots must be a positive integer, got 0"),
        ({"devices": {"cpu": {"torch": ["2.13.0"], "slots": "2"}}}, "devices.cpu.slots must be a positive integer"),
        ({"devices": {"cuda": {"torch": ["2.13.0"], "slots": 2}}},
         "devices.cuda.slots: slots are for CPU launches (a cuda launch has a device per rank)"),
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
    assert m.device("cpu").slots == 1
    two = parse_matrix({**GOOD, "devices": {"cpu": {"torch": ["2.13.0"], "slots": 2}, "cuda": {"torch": ["2.13.0"]}}})
    assert (two.device("cpu").slots, two.device("cuda").slots) == (2, 1)


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


# --------------------------------------------------------------------------- install, scenarios_dirs, sources


def _package(folder):
    """A local package folder (what ``install: ["./pkg"]`` names)."""
    (folder / "acme_marker").mkdir(parents=True)
    (folder / "acme_marker" / "__init__.py").write_text("VALUE = 7\n")
    (folder / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                          'build-backend = "setuptools.build_meta"\n'
                                          '[project]\nname = "acme-marker"\nversion = "0.1"\n')
    return folder


def test_install_entries_and_scenario_folders_are_taken_from_the_matrix_file(tmp_path):
    _package(tmp_path / "pkg")
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "x-1.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_case.py").write_text("SCENARIO = Scenario(model=M, batch=b, world_sizes=(3,))\n")
    m = parse_matrix({**GOOD, "install": {">=2.13": ["./pkg", "dist/x-1.0-py3-none-any.whl"], "<2.13": ["old==1.0"]},
                      "scenarios_dirs": ["mine"], "scenarios": ["plain", "my_case"], "world_sizes": [3]},
                     base=tmp_path)
    assert m.install_for("2.13.0") == ["-e", str(tmp_path / "pkg"), str(tmp_path / "dist" / "x-1.0-py3-none-any.whl")]
    assert m.install_for("2.12.1") == ["old==1.0"]
    assert m.install_for("2.16.0rc1")[:2] == ["-e", str(tmp_path / "pkg")]  # a pre-release is in ">=2.13"
    assert m.scenarios_dirs == (str(tmp_path / "mine"),) and m.scenarios == ("plain", "my_case")
    every = parse_matrix({**GOOD, "install": ["mypkg[train]>=1.2", "./pkg"]}, base=tmp_path)
    assert every.install_for("2.7.1") == every.install_for("2.15.0") == ["mypkg[train]>=1.2", "-e", str(tmp_path / "pkg")]
    assert parse_matrix(GOOD).install_for("2.13.0") == [] and parse_matrix(GOOD).scenarios_dirs == ()


def test_a_prerelease_entry_names_its_source(tmp_path):
    (tmp_path / "rc").mkdir()
    m = parse_matrix({**GOOD, "devices": {"cuda": {"torch": [
        "2.15.0", {"version": "2.16.0rc1", "index_url": "https://download.pytorch.org/whl/test/cu128", "pre": True},
        {"version": "2.17.0.dev20261201", "find_links": "rc", "pre": True}]}}}, base=tmp_path)
    assert m.cells() == [("2.15.0", "cuda"), ("2.16.0rc1", "cuda"), ("2.17.0.dev20261201", "cuda")]
    assert m.source("2.15.0", "cuda") is None
    rc = m.source("2.16.0rc1", "cuda")
    assert rc.prerelease and rc.index_url == "https://download.pytorch.org/whl/test/cu128" and rc.pre
    assert rc.label == "index https://download.pytorch.org/whl/test/cu128; pre-releases allowed"
    dev = m.source("2.17.0.dev20261201", "cuda")
    assert dev.find_links == str(tmp_path / "rc") and dev.label == "find-links rc; pre-releases allowed"
    assert m.transformers_for("2.16.0rc1") is None
    assert parse_matrix({**GOOD, "transformers": {">=2.6": "5.24.0"}}).transformers_for("2.16.0rc1") == "5.24.0"


def _pre(entry):
    return {"devices": {"cpu": {"torch": ["2.15.0", entry]}}}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"install": "mypkg"}, "'install' must be a list of packages, or map torch version ranges"),
        ({"install": [3]}, "'install': bad entry 3"),
        ({"install": ["./no_such_pkg"]}, "'install': './no_such_pkg' is not a requirement, and there is no such path"),
        ({"install": ["./plain_folder"]}, "'install': './plain_folder' is a folder but not a package"),
        ({"install": {"=>2.13": ["x"]}}, "'install': bad torch version range '=>2.13'"),
        ({"install": {">=2.13": []}}, "'install': '>=2.13' must map to a non-empty list"),
        ({"scenarios_dirs": "mine"}, "'scenarios_dirs' must be a list of folders"),
        ({"scenarios_dirs": ["nowhere"]}, "'scenarios_dirs': no folder 'nowhere'"),
        ({"scenarios": ["my_case"]}, "'scenarios': unknown scenario 'my_case'"),
        ({"patches": "./nowhere.py"}, "'patches': no file './nowhere.py'"),
        (_pre("2.16.0rc1"), "devices.cpu.torch: '2.16.0rc1' is a pre-release: give it with its source"),
        (_pre({"version": "2.16.0rc1", "index_url": "https://x/simple"}), "[2.16.0rc1]: 2.16.0rc1 is a pre-release: add pre: true"),
        (_pre({"version": "2.16.0rc1"}), "[2.16.0rc1]: give index_url, find_links or pre: true"),
        (_pre({"version": "2.16", "pre": True}), "devices.cpu.torch: bad version '2.16' in a source entry"),
        (_pre({"version": "2.16.0rc1", "pre": "yes"}), "[2.16.0rc1].pre must be true or false, got 'yes'"),
        (_pre({"version": "2.16.0rc1", "pre": True, "index": "x"}), "devices.cpu.torch: unknown key 'index'"),
        (_pre({"version": "2.16.0rc1", "pre": True, "index_url": "download.pytorch.org"}),
         "[2.16.0rc1].index_url must be an http(s):// or file:// URL"),
        (_pre({"version": "2.16.0rc1", "pre": True, "find_links": "wheels/rc"}), "[2.16.0rc1].find_links: no folder 'wheels/rc'"),
        (_pre({"version": "2.15.0", "find_links": "https://example.org/w"}), "devices.cpu.torch lists a version twice"),
    ],
)
def test_bad_install_folder_and_source_fields_are_named_in_one_line(tmp_path, change, message):
    (tmp_path / "plain_folder").mkdir()
    with pytest.raises(ValueError) as err:
        parse_matrix({**GOOD, **change}, base=tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_another_matrix_file_from_the_environment_or_config(tmp_path):
    from harness.envs.session import matrix_file, records_folder, session_args

    assert matrix_file(ROOT, {}, ["nox", "-s", "matrix"]) == ROOT / "matrix.yaml"
    assert matrix_file(ROOT, {"FSDP_COMPAT_MATRIX": "my.yaml"}, ["nox"]) == ROOT / "my.yaml"
    assert matrix_file(ROOT, {}, ["nox", "-s", "matrix", "--", "--config", str(tmp_path / "m.yaml")]) == tmp_path / "m.yaml"
    assert matrix_file(ROOT, {"FSDP_COMPAT_MATRIX": "my.yaml"}, ["nox", "--", "--config=my.yaml"]) == ROOT / "my.yaml"
    with pytest.raises(ValueError, match="^--config a.yaml and FSDP_COMPAT_MATRIX=b.yaml name different matrix files$"):
        matrix_file(ROOT, {"FSDP_COMPAT_MATRIX": "b.yaml"}, ["nox", "--", "--config", "a.yaml"])
    assert records_folder(ROOT, ROOT / "matrix.yaml") == ROOT / "runs" / "matrix"
    assert records_folder(ROOT, tmp_path / "acme.yaml") == ROOT / "runs" / "matrix-acme"
    assert session_args(["--config", "m.yaml", "--runner", "pytest", "-n", "2"]) == ("pytest", ["-n", "2"])
    with pytest.raises(ValueError, match="--runner must be harness or pytest"):
        session_args(["--runner", "make"])


def test_nox_lists_the_cells_of_another_matrix_file(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "rc").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "acme.yaml").write_text(
        "patches: fsdp_patches\nscenarios_dirs: [mine]\ndevices:\n  cuda:\n    torch:\n      - '2.15.0'\n"
        "      - {version: '2.16.0rc1', find_links: rc, pre: true}\n")
    for how in (["--", "--config", str(tmp_path / "acme.yaml")], []):
        env = {**os.environ, **({} if how else {"FSDP_COMPAT_MATRIX": str(tmp_path / "acme.yaml")})}
        out = subprocess.run([sys.executable, "-m", "nox", "--json", "-l", "-s", "matrix", *how], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert [s["session"] for s in json.loads(out.stdout)] == [
            "matrix(torch='2.15.0', device='cuda')", "matrix(torch='2.16.0rc1', device='cuda')"]
    (tmp_path / "acme.yaml").write_text("devices:\n  cpu:\n    torch: ['2.16.0rc1']\n")
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FSDP_COMPAT_MATRIX": str(tmp_path / "acme.yaml")})
    assert out.returncode == 2
    assert (out.stdout + out.stderr).strip() == ("error: acme.yaml: devices.cpu.torch: '2.16.0rc1' is a pre-release: "
                                                "give it with its source, {version: \"2.16.0rc1\", index_url: ... or "
                                                "find_links: ..., pre: true}")
