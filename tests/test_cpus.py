"""harness.process.cpus: a core per rank only where ranks outnumber cores, spread so slots' judges differ."""

import os
import subprocess
import sys
from collections import Counter

import pytest

from harness.process.cpus import rank_core
from tests.support import ROOT


def test_enough_cores_pins_nothing():
    assert [rank_core(r, 4, list(range(4))) for r in range(4)] == [None] * 4
    assert rank_core(0, 2, [0, 1, 2, 3]) is None
    assert rank_core(0, 1, []) is None


def test_four_ranks_on_two_cores_share_them_evenly_and_slot_judges_differ():
    cores = [rank_core(r, 4, [0, 1]) for r in range(4)]
    assert cores == [0, 1, 1, 0]
    assert cores[0] != cores[2]  # world-size-2 slots {0,1} and {2,3}: their judges on different cores
    assert cores[0] != cores[1] and cores[2] != cores[3]  # a slot's two ranks never share one


@pytest.mark.parametrize("world, n", [(8, 2), (8, 3), (16, 6), (5, 4)])
def test_every_core_gets_its_share(world, n):
    counts = Counter(rank_core(r, world, list(range(10, 10 + n))) for r in range(world))
    assert set(counts) == set(range(10, 10 + n))
    assert max(counts.values()) - min(counts.values()) <= 1


TWO_CORES = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                               reason="needs affinity control and two cores")


def _on_two_cores(code: str) -> tuple[list[int], str]:
    """The machine's first two cores, and what ``code`` printed, run in a fresh process restricted to them."""
    two = sorted(os.sched_getaffinity(0))[:2]
    out = subprocess.run([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {set(two)!r})\n{code}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return two, out.stdout


@TWO_CORES
def test_pinning_reaches_threads_started_before_and_after():
    two, out = _on_two_cores("""
import threading
seen = []
before = threading.Thread(target=lambda: (threading.Event().wait(0.5), seen.append(os.sched_getaffinity(0))))
before.start()
from harness.process.cpus import pin_rank
core = pin_rank(1, 4)
after = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
after.start(); after.join(); before.join()
print(core, sorted(os.sched_getaffinity(0)), [sorted(s) for s in seen])
""")
    assert out.split(None, 1) == [str(two[1]), f"[{two[1]}] {[[two[1]], [two[1]]]}\n"]


@TWO_CORES
def test_unpin_gives_back_the_cores_a_process_had_before_it_was_pinned_and_repin_pins_again():
    two, out = _on_two_cores("""
from harness.process.cpus import pin_rank, repin, unpin
first = unpin() or repin()  # not pinned yet: nothing to give back or pin again
core = pin_rank(0, 4)
pinned = sorted(os.sched_getaffinity(0))
print(first, core, pinned, unpin(), sorted(os.sched_getaffinity(0)), repin(), sorted(os.sched_getaffinity(0)))
""")
    assert out.split() == ["False", str(two[0]), f"[{two[0]}]", "True", *f"{two}".split(), "True", f"[{two[0]}]"]


def test_the_kernel_sets_a_cpu_can_run_come_from_its_flags():
    from harness.process.cpus import kernel_sets

    assert kernel_sets(set()) == ["default"]
    assert kernel_sets({"sse4_2", "avx2", "fma"}) == ["default", "avx2"]
    assert kernel_sets({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}) == ["default", "avx2", "avx512"]
    assert kernel_sets({"avx2", "avx512f"}) == ["default", "avx2"]  # avx512 kernels need bw, vl and dq too
    assert kernel_sets()[0] == "default"  # this machine
