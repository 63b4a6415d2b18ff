"""Re-home sharded grads onto a group with a given backend (NCCL-only simulation)."""

from __future__ import annotations

__all__ = ["rehome"]


def rehome(params, backend: str):
    raise NotImplementedError("norm_group_backend is not supported yet")
