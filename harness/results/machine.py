"""Facts about this machine and its torch, stamped on every record."""

from __future__ import annotations

import functools
import os
import platform
import socket
from typing import Any

__all__ = ["TORCH_SOURCE_ENV", "cpu_model", "environment", "torch_info"]

#: where torch came from when not from the default index (``nox -s matrix`` sets it from a
#: ``matrix.yaml`` source entry: "index URL", "find-links PATH", "pre-releases allowed")
TORCH_SOURCE_ENV = "FSDP_COMPAT_TORCH_SOURCE"


@functools.cache
def torch_info() -> dict[str, str | None]:
    import torch

    return {"torch": torch.__version__, "torch_git": getattr(torch.version, "git_version", None),
            "cuda": torch.version.cuda}


@functools.cache
def environment() -> dict[str, Any]:
    """What a record's ``env`` holds: python, torch (build, CUDA, source), GPU, host, platform,
    CPU count and model, the CPU kernel set torch dispatches to (``ATEN_CPU_CAPABILITY`` picks
    another) and this process's intra-op threads."""
    import torch

    cuda = torch_info()["cuda"]
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torch_build": f"cu{cuda.replace('.', '')}" if cuda else "cpu", "cuda": cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "host": socket.gethostname(), "platform": f"{platform.system()}-{platform.machine()}",
            "cpus": os.cpu_count(), "torch_source": os.environ.get(TORCH_SOURCE_ENV) or None,
            "cpu_model": cpu_model(), "cpu_capability": capability() if capability else None,
            "threads": torch.get_num_threads()}


def cpu_model() -> str | None:
    """The CPU's model name (Linux: ``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
