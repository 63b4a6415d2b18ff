"""``os.environ`` as a cell's process-wide state holds it (``harness.rank.state``): copied and compared
as the OS holds it (bytes on POSIX, at C speed, where ``dict(os.environ)`` decodes every name and
value: a third of a state's take), decoded only where it changed."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["changes", "decoded", "now", "put_back"]

#: torch records the cache folder it computes (the same each time) on first use, e.g. on
#: ``use_deterministic_algorithms(True)``: kept, and no caveat, where a cell set them
_TORCH_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def now() -> dict[Any, Any]:
    """A copy of ``os.environ``'s own store."""
    data = getattr(os.environ, "_data", None)
    return data.copy() if isinstance(data, dict) else dict(os.environ)


def decoded(environ: dict[Any, Any]) -> dict[str, str]:
    """``now()``'s copy as ``os.environ`` shows it."""
    decode = getattr(os.environ, "decodekey", None), getattr(os.environ, "decodevalue", None)
    if None in decode or not isinstance(getattr(os.environ, "_data", None), dict):
        return dict(environ)
    return {decode[0](k): decode[1](v) for k, v in environ.items()}


def put_back(before: dict[Any, Any]) -> None:
    """``os.environ`` as ``before`` (``now()``'s) held it; torch's cache folders set since stay."""
    wanted = decoded(before)
    for name in set(os.environ) - set(wanted) - set(_TORCH_CACHES):
        del os.environ[name]
    os.environ.update(wanted)


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Names only: values may be secrets."""
    out = [f"left os.environ[{k!r}] set" for k in sorted(set(after) - set(before) - set(_TORCH_CACHES))]
    out += [f"left os.environ[{k!r}] changed" for k in sorted(set(after) & set(before)) if after[k] != before[k]]
    out += [f"left os.environ[{k!r}] unset" for k in sorted(set(before) - set(after))]
    return out
