from harness.envs.install import cpu_overrides, torch_install_args


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
    monkeypatch.setattr("harness.envs.install.LOCAL_WHEELS", [])
    monkeypatch.setenv("FSDP_COMPAT_WHEELS", str(wheels))
    args = torch_install_args("2.13.0", "cpu", tmp_path / "venv")
    assert args[:1] == ["torch==2.13.0"] and args[-2:] == ["--find-links", str(wheels)]
    other = torch_install_args("2.12.1", "cpu", tmp_path / "venv")
    assert other[-2] == "--override" and (tmp_path / "venv" / "cpu-overrides.txt").read_text() == cpu_overrides("2.12.1")
    cuda = torch_install_args("2.12.1", "cuda", tmp_path / "venv")
    assert "--override" not in cuda and "--find-links" not in cuda
