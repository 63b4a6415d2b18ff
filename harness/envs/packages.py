"""What to install for one torch version on one device (used by noxfile.py).

Facts this rests on: PyPI's Linux torch wheels are CUDA builds whose import needs their
nvidia-* libraries (a ``--no-deps`` install fails on ``libcudnn.so.9``), but not Triton;
some machines carry a local CPU wheel folder (``/opt/wheels``) that uv does not search
unless told. uv caches every wheel once and hard-links it into each venv.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.envs.sources import TorchSource

__all__ = ["HARNESS_DEPS", "LOCAL_WHEELS", "cpu_overrides", "source_args", "torch_install_args"]

#: what the harness needs beside torch in every environment it makes: running cells
#: (psutil reaps process trees) and building reports and diffs from that venv
HARNESS_DEPS = ("packaging", "numpy", "psutil", "pandas", "tabulate", "jinja2", "pyyaml")

#: local wheel folders searched when they exist (FSDP_COMPAT_WHEELS adds more, ':'-separated)
LOCAL_WHEELS = ["/opt/wheels"]

#: CPU cells never compile kernels: leave Triton (0.5-1 GB per version) out.
_NO_TRITON = 'triton ; sys_platform == "never"'

#: CPU cells only need the CUDA libraries to be importable. One set per CUDA major, the
#: newest any release of that line pins, is shared (hard-linked from uv's cache) by every
#: torch version of the line instead of one set per release. Newer minor versions of a
#: CUDA 12 / 13 library keep the older ones' sonames and symbols.
_CU12 = """\
nvidia-cuda-nvrtc-cu12==12.8.93
nvidia-cuda-runtime-cu12==12.8.90
nvidia-cuda-cupti-cu12==12.8.90
nvidia-cudnn-cu12==9.10.2.21
nvidia-cublas-cu12==12.8.4.1
nvidia-cufft-cu12==11.3.3.83
nvidia-curand-cu12==10.3.9.90
nvidia-cusolver-cu12==11.7.3.90
nvidia-cusparse-cu12==12.5.8.93
nvidia-nccl-cu12==2.27.5
nvidia-nvshmem-cu12==3.4.5
nvidia-nvtx-cu12==12.8.90
nvidia-nvjitlink-cu12==12.8.93
nvidia-cufile-cu12==1.13.1.3
cuda-bindings==12.9.4
"""
_CU13 = """\
cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.2.2
nvidia-cublas
nvidia-cudnn-cu13==9.26.0.51
nvidia-cusparselt-cu13==0.8.1
nvidia-nccl-cu13==2.30.7
nvidia-nvshmem-cu13==3.7.2
"""


def source_args(source: TorchSource | None) -> list[str]:
    """``uv pip install`` arguments for a version's own source (``matrix.yaml``): its index,
    searched before the default one, so the harness's other packages still come from there;
    its wheel folder or page; pre-releases allowed."""
    if source is None:
        return []
    args = ["--extra-index-url", source.index_url] if source.index_url else []
    args += ["--find-links", source.find_links] if source.find_links else []
    return args + (["--prerelease", "allow"] if source.pre else [])


def torch_install_args(version: str, device: str, folder: Path, source: TorchSource | None = None) -> list[str]:
    """Arguments for ``uv pip install`` (nox's ``session.install``) of torch ``version``.

    CPU cells take a local CPU wheel where one exists (the version's own find-links
    folder first), and otherwise the CUDA build with shared CUDA libraries and no Triton
    (``cpu_overrides``); CUDA cells take the release exactly as published. ``source``: the
    version's own index or wheels (``source_args``).
    """
    args = [f"torch=={version}", *HARNESS_DEPS, *source_args(source)]
    if device != "cpu":
        return args
    own = source.find_links if source and source.find_links and Path(source.find_links).is_dir() else None
    for wheels in [*([own] if own else []), *_wheel_folders()]:
        if any(Path(wheels).glob(f"torch-{version}+cpu-*.whl")):
            return args if wheels == own else [*args, "--find-links", wheels]  # its own folder is searched already
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cpu-overrides.txt"
    path.write_text(cpu_overrides(version))
    return [*args, "--override", str(path)]


def cpu_overrides(version: str) -> str:
    """uv override lines for a CPU-only environment of torch ``version``."""
    from packaging.version import Version

    line = _CU12 if Version(version) < Version("2.11") else _CU13
    return f"{_NO_TRITON}\n{line}"


def _wheel_folders() -> list[str]:
    extra = [p for p in os.environ.get("FSDP_COMPAT_WHEELS", "").split(os.pathsep) if p]
    return [f for f in [*extra, *LOCAL_WHEELS] if Path(f).is_dir()]
