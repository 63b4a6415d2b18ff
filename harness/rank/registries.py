"""What torch keeps in containers rather than attributes, which a cell may leave changed:
global module hooks (``register_module_forward_hook`` and its kin), default saved-tensor
hooks (``saved_tensors_hooks`` entered and never left), the dynamo, inductor and functorch
configs, DTensor's sharding rules (an op strategy registered for an op that had none). Taken at a cell's start, named and (where cells share a process) put back after it
(``harness.rank.leaks.CellState``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.versiontags import TAG_VALUE, dict_tag

__all__ = ["Registries"]

_MISSING = object()


#: config entries torch sets from a setting ``harness.rank.state`` names
#: (``use_deterministic_algorithms`` sets inductor's ``deterministic``)
_DERIVED_CONFIG = frozenset({"torch._inductor.config.deterministic"})

#: the global module hook registries of ``torch.nn.modules.module`` (those this torch has)
_HOOK_REGISTRIES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                    "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs",
                    "_global_forward_hooks_always_called", "_global_module_registration_hooks",
                    "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")
#: config modules whose settings a cell may leave changed
_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


def _saved_tensor_hooks() -> Any:
    """The default saved-tensor hooks on top of torch's stack (None: none in force)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    try:
        return top(False) if top is not None else None
    except Exception:
        return None


def _propagator() -> Any:
    """DTensor's sharding propagator, where ``torch.distributed.tensor`` is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    dispatcher = getattr(getattr(module, "DTensor", None), "_op_dispatcher", None)
    return getattr(dispatcher, "sharding_propagator", None)


def _rule_tables() -> dict[str, dict[Any, Any]]:
    """The propagator's op tables themselves (``op_strategy_funcs`` and its kin)."""
    prop = _propagator()
    return {k: v for k, v in vars(prop).items() if isinstance(v, dict)} if prop is not None else {}


def _clear_rule_cache() -> None:
    """Forget cached sharding decisions (made under rules that were put back)."""
    cached = getattr(_propagator(), "propagate_op_sharding", None)
    for clear in (getattr(cached, "cache_clear", None), getattr(getattr(cached, "cache", None), "cache_clear", None)):
        if clear is not None:
            clear()
            return


def _config(name: str) -> dict[str, Any] | None:
    module = sys.modules.get(name)
    copy = getattr(module, "get_config_copy", None)
    try:
        return copy() if copy is not None else None
    except Exception:
        return None


@dataclass
class Registries:
    """torch's global registries (see the module's docstring), at ``take()``."""

    hooks: dict[str, dict[Any, Any]]
    saved_tensor_hooks: Any
    configs: dict[str, dict[str, Any] | None]
    #: DTensor's sharding rules (``_rules``)
    rules: dict[str, dict[Any, Any]]
    #: per rule table: (the table's id, a reader of its dict version tag, the tag at ``take``):
    #: a table whose tag has not moved is unchanged and not compared entry by entry
    rule_tags: dict[str, tuple[int, Any, object]] = field(default_factory=dict)

    @classmethod
    def take(cls) -> Registries:
        module = sys.modules.get("torch.nn.modules.module")
        hooks = {name: dict(getattr(module, name)) for name in _HOOK_REGISTRIES if isinstance(getattr(module, name, None), dict)}
        tables = _rule_tables()
        tags = {k: (id(v), reader, TAG_VALUE(reader)) for k, v in tables.items() for reader in [dict_tag(v)]}
        return cls(hooks=hooks, saved_tensor_hooks=_saved_tensor_hooks(), configs={name: _config(name) for name in _CONFIGS},
                   rules={k: dict(v) for k, v in tables.items()}, rule_tags=tags)

    def changes(self) -> list[str]:
        """One caveat per registry that differs now ("left a global forward hook registered")."""
        return self.settle(put_back=False)

    def settle(self, *, put_back: bool) -> list[str]:
        """The caveats of ``changes``; with ``put_back`` (cells that share a process) the
        registries are put back too, and what could not be is marked "(not undone)". Each
        config is copied once (a deep copy, about 0.4 ms: in-place changes of its lists and
        sets show) and again only where it differed."""
        out: list[str] = []
        module = sys.modules.get("torch.nn.modules.module")
        for name, before in self.hooks.items():
            registry = getattr(module, name, None)
            added = list(registry.keys() - before.keys()) if isinstance(registry, dict) else []
            if not added:
                continue
            kind = name.removeprefix("_global_").removesuffix("s").replace("_", " ")
            out.append(f"left {len(added)} global module {kind}(s) registered ({name})")
            if put_back:
                for key in added:
                    del registry[key]
        if _saved_tensor_hooks() != self.saved_tensor_hooks:
            caveat = "left default saved-tensor hooks in force (saved_tensors_hooks entered, never exited)"
            if put_back:
                pop = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
                for _ in range(8):  # hooks entered by the cell sit on top of the stack
                    if pop is None or _saved_tensor_hooks() == self.saved_tensor_hooks:
                        break
                    try:
                        pop()
                    except Exception:
                        break
                if _saved_tensor_hooks() != self.saved_tensor_hooks:
                    caveat += " (not undone)"
            out.append(caveat)
        out += self._settle_rules(put_back)
        for name, before in self.configs.items():
            now = _config(name)
            if before is None or now is None or now == before:
                continue
            keys = sorted(k for k in now.keys() | before.keys() if now.get(k, _MISSING) != before.get(k, _MISSING)
                          and f"{name}.{k}" not in _DERIVED_CONFIG)
            if put_back:
                try:
                    sys.modules[name].load_config(before)
                except Exception:
                    pass
            if not keys:
                continue
            caveat = f"left {name} changed: {', '.join(keys[:5])}" + (" ..." if len(keys) > 5 else "")
            out.append(caveat + (" (not undone)" if put_back and _config(name) != before else ""))
        return out

    def _settle_rules(self, put_back: bool) -> list[str]:
        prop, out = _propagator(), []
        for name, before in self.rules.items():
            table = getattr(prop, name, None)
            if not isinstance(table, dict):
                continue
            table_id, reader, tag = self.rule_tags.get(name, (None, None, None))
            if table_id == id(table) and TAG_VALUE(reader) == tag:
                continue  # not changed since ``take``
            changed = [k for k in table.keys() | before.keys() if table.get(k, _MISSING) is not before.get(k, _MISSING)]
            if not changed:
                continue
            shown = ", ".join(sorted(str(k) for k in changed)[:3]) + (" ..." if len(changed) > 3 else "")
            out.append(f"left DTensor sharding rules changed ({name}: {shown})")
            if put_back:
                for key in changed:
                    if key in before:
                        table[key] = before[key]
                    else:
                        del table[key]
                _clear_rule_cache()
        return out

    def restore(self) -> None:
        """Put the registries back (cells that share a process); what cannot be, stays named."""
        self.settle(put_back=True)
