"""Public torch APIs that do what a patch does (the ``api`` variant turns them on)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["UNUSED_PARAMS_API", "PublicApi"]


@dataclass(kw_only=True, frozen=True)
class PublicApi:
    """A public torch API that does what a patch does: the ``api`` variant turns it on
    (through the ``Sharding`` fields in ``sharding``) on stock torch, and where it fixes
    what the patch fixes, the report says "replace the patch with this call"."""

    name: str
    since: str
    replaces: tuple[str, ...]
    sharding: dict[str, object] = field(default_factory=dict)

    def available(self) -> bool:
        import importlib

        owner, _, attr = self.name.rpartition(".")
        try:
            return hasattr(getattr(importlib.import_module("torch.distributed.fsdp"), owner), attr)
        except (ImportError, AttributeError):
            return False

    def describe(self) -> str:
        return f"{self.name} (torch >= {self.since})"


#: From torch 2.13 FSDP2 can reduce-scatter unused parameters itself (zero-filled).
UNUSED_PARAMS_API = PublicApi(name="FSDPModule.set_reduce_scatter_unused_params", since="2.13",
                              replaces=("unused_param_reduction",), sharding={"reduce_scatter_unused_params": True})
