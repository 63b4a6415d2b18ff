"""Public torch APIs that do what a patch does (the ``api`` variant turns them on).

An API is turned on in one of two declarative ways, or both:

* ``sharding``: ``Sharding`` fields the ``api`` variant sets before ``fully_shard`` (an
  opt-in the harness applies itself, e.g. ``reduce_scatter_unused_params``, or
  ``MixedPrecisionPolicy`` fields through ``Sharding.mp_fields``);
* ``configure(module, dp_world)``: a call on every FSDP module once the whole model is
  sharded, children first and the root last (FSDP2's setters do not recurse), e.g.
  ``lambda m, world: m.set_force_sum_reduction_for_comms(True)``. ``dp_world`` is the
  number of data-parallel ranks, for factors that depend on it.

A setter that must be called on the root only (``set_manual_backward_finalization``)
goes in ``configure_root(root, dp_world)``, called after ``configure``.

An API that acts after backward also gives ``finalize(root)``: called on the root FSDP
module at the end of each accumulation window of a scenario that lists ``ReduceAfterWindow()``
(``root.finalize_backward()``), instead of the patches module's ``finalize_backward``.

``available()`` is true only where torch has ``name`` and every entry of ``needs``; an
``api`` cell on a torch without them is skipped with the reason, like any recipe that
needs a feature torch lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["UNUSED_PARAMS_API", "PublicApi", "torch_has"]


def torch_has(qualified: str) -> bool:
    """Whether ``torch.distributed.fsdp`` has ``Owner.attr`` (a method, attribute or
    dataclass field of ``Owner``), e.g. ``"MixedPrecisionPolicy.param_dtype_override_fn"``."""
    import importlib

    owner_name, _, attr = qualified.rpartition(".")
    try:
        owner = getattr(importlib.import_module("torch.distributed.fsdp"), owner_name)
    except (ImportError, AttributeError):
        return False
    if dataclasses.is_dataclass(owner) and attr in {f.name for f in dataclasses.fields(owner)}:
        return True
    return hasattr(owner, attr)


@dataclass(kw_only=True, frozen=True)
class PublicApi:
    """A public torch API that does what a patch does: the ``api`` variant turns it on
    (``sharding`` fields, then ``configure`` on every FSDP module) on stock torch, and
    where it fixes what the patch fixes, the report says "replace the patch with this call".

    ``scales_grads``: ``configure`` applies the scenario's ``grad_scale`` inside the
    reduction (a gradient divide factor), so the FSDP side does not multiply the grads
    itself; the reference still does. ``reference_quirks=False``: the API takes the
    backend behaviour the reference models out of play (a forced-sum reduction never asks
    gloo for AVG), so the ``api`` variant is judged against the plain reference.
    """

    name: str
    since: str
    replaces: tuple[str, ...]
    sharding: dict[str, object] = field(default_factory=dict)
    configure: Callable[[nn.Module, int], object] | None = None
    scales_grads: bool = False
    reference_quirks: bool | None = None
    #: other ``Owner.attr`` names the API needs (``configure`` may call several setters)
    needs: tuple[str, ...] = ()
    #: called on the root FSDP module only, after ``configure`` (setters torch allows on the root only)
    configure_root: Callable[[nn.Module, int], object] | None = None
    #: called on the root after each accumulation window of a scenario with ``ReduceAfterWindow()``
    finalize: Callable[[nn.Module], object] | None = None
    #: a hook of the scenario calls it at its points of the step (a setter changed between
    #: steps: ``ReshardAfterForward``), so neither ``sharding`` nor ``configure`` is needed
    by_hook: bool = False

    def __post_init__(self) -> None:
        for qualified in (self.name, *self.needs):
            if "." not in qualified:
                raise ValueError(f"PublicApi: {qualified!r} is not 'Owner.attr' (e.g. 'FSDPModule.set_...')")
        if self.scales_grads and self.configure is None:
            raise ValueError(f"PublicApi {self.name}: scales_grads needs a configure that sets the divide factor")
        if not self.sharding and self.configure is None and self.configure_root is None and not self.by_hook:
            raise ValueError(f"PublicApi {self.name}: give sharding fields, a configure call, or both "
                             "(or by_hook=True where a hook of the scenario calls it)")

    def available(self) -> bool:
        return all(torch_has(q) for q in (self.name, *self.needs))

    def describe(self) -> str:
        return f"{self.name} (torch >= {self.since})"


#: From torch 2.13 FSDP2 can reduce-scatter unused parameters itself (zero-filled).
UNUSED_PARAMS_API = PublicApi(name="FSDPModule.set_reduce_scatter_unused_params", since="2.13",
                              replaces=("unused_param_reduction",), sharding={"reduce_scatter_unused_params": True})
