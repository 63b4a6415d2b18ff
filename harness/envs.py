"""What to install for one torch version on one device (used by noxfile.py).

Facts this rests on: PyPI's Linux torch wheels are CUDA builds whose import needs their
nvidia-* libraries (a ``--no-deps`` install fails on ``libcudnn.so.9``), but not Triton;
some machines carry a local CPU wheel folder (``/opt/wheels``) that uv does not search
unless told. uv caches every wheel once and hard-links it into each venv.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCAL_WHEELS", "torch_install_args", "write_overrides"]

#: local wheel folders searched when they exist (FSDP_COMPAT_WHEELS adds more, ':'-separated)
LOCAL_WHEELS = ["/opt/wheels"]

#: CPU cells never compile kernels: leave Triton (0.5-1 GB per version) out.
CPU_OVERRIDES = 'triton ; sys_platform == "never"\n'


def torch_install_args(version: str, device: str, overrides: Path | None) -> list[str]:
    """Arguments for ``uv pip install`` (or ``session.install``) of torch ``version``."""
    args = [f"torch=={version}", "packaging"]
    for folder in _wheel_folders():
        if any(Path(folder).glob(f"torch-{version}+cpu-*.whl")) and device == "cpu":
            args += ["--find-links", folder]
    if device == "cpu" and overrides is not None:
        args += ["--override", str(overrides)]
    return args


def write_overrides(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cpu-overrides.txt"
    path.write_text(CPU_OVERRIDES)
    return path


def _wheel_folders() -> list[str]:
    extra = [p for p in os.environ.get("FSDP_COMPAT_WHEELS", "").split(os.pathsep) if p]
    return [f for f in [*extra, *LOCAL_WHEELS] if Path(f).is_dir()]
