"""The collector's freeze between a long-lived process's cells (``harness.process.collector``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r'''
import gc, weakref
from harness.process import collector

class Node:
    pass

collector.freeze()
frozen = gc.get_freeze_count()
assert collector.refreeze() is False, "no full collection since the freeze: nothing to do"
assert gc.get_freeze_count() == frozen

gc.collect(0)
assert collector.refreeze() is False, "a young collection is not a full one"

gc.collect()  # a full collection, as the collector runs on its own, or a resource measure per step
live = Node()
cycle_a, cycle_b = Node(), Node()
cycle_a.other, cycle_b.other = cycle_b, cycle_a  # a reference cycle: garbage only a collection frees
gone = weakref.ref(cycle_a)
del cycle_a, cycle_b
assert gone() is not None
assert collector.refreeze() is True
assert gone() is None, "the cycle was collected before the freeze, not frozen"
assert gc.get_freeze_count() > frozen
assert not any(o is live for o in gc.get_objects()), "what survived is out of the collector's view"
assert collector.refreeze() is False, "frozen already, nothing collected since"

gc.disable()
gc.collect()
assert collector.refreeze() is False, "a process that turned the collector off keeps it off, unfrozen"
print("ok")
'''


def test_refreeze_freezes_what_survives_a_full_collection_and_collects_cycles_first():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
