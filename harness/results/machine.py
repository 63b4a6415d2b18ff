"""Facts about this machine and its torch, stamped on every record."""

from __future__ import annotations

import functools
import os
import platform
import socket
from typing import Any

__all__ = ["TORCH_SOURCE_ENV", "environment", "torch_info"]

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
    import torch

    cuda = torch_info()["cuda"]
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torch_build": f"cu{cuda.replace('.', '')}" if cuda else "cpu", "cuda": cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "host": socket.gethostname(), "platform": f"{platform.system()}-{platform.machine()}",
            "cpus": os.cpu_count(), "torch_source": os.environ.get(TORCH_SOURCE_ENV) or None}
