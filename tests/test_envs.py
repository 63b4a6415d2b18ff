import pytest

from harness.envs.packages import cpu_overrides, torch_install_args


def test_cpu_overrides_drop_triton_and_share_cuda_libraries_per_major():
    old, new = cpu_overrides("2.7.1"), cpu_overrides("2.12.1")
    assert 'triton ; sys_platform == "never"' in old and 'triton ; sys_platform == "never"' in new
    assert "nvidia-cudnn-cu12==" in old and "cu13" not in old
    assert "nvidia-cudnn-cu13==" in new and "cu12" not in new
    assert cpu_overrides("2.10.0") == old and cpu_overrides("2.15.0") == new


def test_install_args_prefer_a_local_cpu_wheel(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    monkeypatch.setenv("FSDP_COMPAT_WHEELS", str(wheels))
    args = torch_install_args("2.13.0", "cpu", tmp_path / "venv")
    assert args[:1] == ["torch==2.13.0"] and args[-2:] == ["--find-links", str(wheels)]
    other = torch_install_args("2.12.1", "cpu", tmp_path / "venv")
    assert other[-2] == "--override" and (tmp_path / "venv" / "cpu-overrides.txt").read_text() == cpu_overrides("2.12.1")
    cuda = torch_install_args("2.12.1", "cuda", tmp_path / "venv")
    assert "--override" not in cuda and "--find-links" not in cuda


def _fake_torch_wheel(folder, version):
    """A wheel named torch ``version`` holding one module (no torch inside: for install paths only)."""
    import base64
    import hashlib
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    dist = f"torch-{version}.dist-info"
    files = {"torch/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for name, text in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_a_prerelease_from_its_own_find_links_folder_installs(tmp_path):
    """The pre-release lane's install arguments, run by uv into a fresh venv, offline: the
    candidate comes from the matrix entry's own wheel folder."""
    import shutil
    import subprocess

    from harness.envs.matrix import parse_matrix
    from harness.envs.packages import HARNESS_DEPS, source_args

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    _fake_torch_wheel(tmp_path / "rc-wheels", "2.16.0rc1")
    m = parse_matrix({"devices": {"cuda": {"torch": ["2.15.0", {"version": "2.16.0rc1", "find_links": "rc-wheels",
                                                                 "pre": True}]}}}, base=tmp_path)
    source = m.source("2.16.0rc1", "cuda")
    assert source_args(source) == ["--find-links", str(tmp_path / "rc-wheels"), "--prerelease", "allow"]
    assert source_args(None) == []
    args = torch_install_args("2.16.0rc1", "cuda", tmp_path / "venv-data", source)
    assert args == ["torch==2.16.0rc1", *HARNESS_DEPS, *source_args(source)]
    indexed = parse_matrix({"devices": {"cuda": {"torch": [{"version": "2.16.0rc1", "pre": True,
                                                             "index_url": "https://download.pytorch.org/whl/test"}]}}})
    assert source_args(indexed.source("2.16.0rc1", "cuda"))[:2] == ["--extra-index-url", "https://download.pytorch.org/whl/test"]
    # the torch pin and the source's arguments, as the session passes them (the harness's other packages left out: offline)
    subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], check=True, timeout=60)
    python = tmp_path / "venv" / "bin" / "python"
    install = [uv, "pip", "install", "-q", "--offline", "--no-index", "--python", str(python), args[0], *source_args(source)]
    res = subprocess.run(install, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == "2.16.0rc1"


def test_a_cpu_prerelease_wheel_in_its_own_folder_needs_no_cuda_overrides(tmp_path, monkeypatch):
    from harness.envs.sources import TorchSource

    monkeypatch.setattr("harness.envs.packages.LOCAL_WHEELS", [])
    monkeypatch.delenv("FSDP_COMPAT_WHEELS", raising=False)
    own = tmp_path / "rc"
    own.mkdir()
    (own / "torch-2.16.0rc1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    source = TorchSource(version="2.16.0rc1", find_links=str(own), pre=True, label="find-links rc")
    args = torch_install_args("2.16.0rc1", "cpu", tmp_path / "venv", source)
    assert "--override" not in args and args.count("--find-links") == 1 and args[-2:] == ["--prerelease", "allow"]
    elsewhere = TorchSource(version="2.16.0rc2", find_links=str(own), pre=True, label="find-links rc")
    assert "--override" in torch_install_args("2.16.0rc2", "cpu", tmp_path / "venv", elsewhere)
