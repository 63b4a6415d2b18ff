"""The cyclic garbage collector paused while a process imports torch and plans, then frozen.

Importing torch, ``torch.distributed.fsdp`` and transformers creates about 560,000 objects
that live as long as the process. With the collector running, every few thousand of them
start a collection, and the full ones walk all of them again: measured on 2 cores
(torch 2.13, transformers 5.24), 2.4–2.6 s of CPU with it, 1.85–1.9 s without. Those
collections find next to nothing to free (a collection right after found 11,162 objects
of garbage).

So the processes that import and then live on (``harness run``'s own process, the launch's
prestarted server) ``pause`` the collector first and ``settle`` once their imports and plan
are done: whatever exists then is moved out of the collector's view for good (``gc.freeze``,
as a rank's warm-up always did: forked ranks then never walk, nor copy-on-write, those pages)
and the collector runs again from there. ``settle`` does that only where ``pause`` turned the
collector off, so a process that had it off on purpose keeps it off.
"""

from __future__ import annotations

import gc

__all__ = ["freeze", "pause", "paused", "refreeze", "settle"]

_PAUSED = False
#: full collections this process had run at its last ``freeze`` (``refreeze``)
_FULL_AT_FREEZE = 0


def pause() -> None:
    """Stop the collector until ``settle`` (a no-op where it is already off)."""
    global _PAUSED
    if gc.isenabled():
        gc.disable()
        _PAUSED = True


def paused() -> bool:
    """Whether ``pause`` has the collector off now."""
    return _PAUSED


def settle() -> None:
    """Where ``pause`` turned the collector off: freeze every object that exists now
    (``gc.freeze``) and turn it back on. Elsewhere (a test calling the pipeline, a cold rank)
    nothing changes."""
    global _PAUSED
    if _PAUSED:
        freeze()
        _PAUSED = False
        gc.enable()


def freeze() -> None:
    """``gc.freeze``, noted for ``refreeze``: every object that exists now leaves the collector's view."""
    global _FULL_AT_FREEZE
    gc.freeze()
    _FULL_AT_FREEZE = gc.get_stats()[2]["collections"]


def refreeze() -> bool:
    """Between two units of work of a long-lived process (a worker's cells, a referee's
    references): where the collector has run a full collection on its own since the last
    ``freeze``, collect once more and freeze what survives. What such a process keeps from
    cell to cell (torch's dispatch and sharding caches, the modules a cell imported: about
    140,000 objects in a worker of the 2.13 suite) otherwise stays in every full collection's
    walk, 50–80 ms each: the collector's own during training, and one per step where a cell
    measures its resources (``harness.train.resources``). The collection comes first so that
    the last cell's garbage in reference cycles is freed, not frozen. Returns whether it froze."""
    if not gc.isenabled() or gc.get_stats()[2]["collections"] == _FULL_AT_FREEZE:
        return False
    gc.collect()
    freeze()
    return True
