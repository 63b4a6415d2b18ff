"""Which core a rank runs on when a launch has more ranks than the machine has cores.

Left to the scheduler, four ranks on two cores keep moving between them: every collective
waits for a rank to be woken on another core, and a small gloo all-reduce among them took
5.9 ms (2.0 ms of CPU per rank) where pinning each rank to one core made it 2.8 ms (0.9 ms).
Ranks are spread so that the first rank of every slot (``harness.plan.placement``), which
judges its cells, lands on a different core from the next slot's: with two cores, ranks
0, 1, 2, 3 go to cores 0, 1, 1, 0. With no more ranks than cores nothing is pinned.

The worker's zygote (``harness.rank.forked``) runs on the cores the worker had before it was
pinned (``unpin``); the cells' and referees' processes it forks are pinned to the rank's core
again (``repin``). Pinned too, with the ranks forked from one warm server
(``harness.launch.forkserver``), a zygote reaping a crashed cell's process spent seconds in
the kernel (``wait4`` -> ``release_task`` -> ``proc_flush_pid`` -> ``d_invalidate`` ->
``shrink_dcache_parent``, sampled from ``/proc/<pid>/stack``; 0.8-13 s of system time per
zygote where unpinned it spends 0.1 s) and now and then past the next cell's deadline: 4 of
14 warm runs of the 2.13 suite had cells not as expected; with the zygote unpinned 0 of 3, and
0 of 3 again with its children pinned (2026-12-06, Linux 6.18). Cold starts never showed it;
which lock the pinned reaper queues on is not known.
"""

from __future__ import annotations

import os

__all__ = ["kernel_sets", "pin_rank", "rank_core", "repin", "unpin"]

#: ``ATEN_CPU_CAPABILITY`` values (the CPU kernel set torch dispatches to) and the cpuinfo flags each needs
_KERNEL_SETS = (("default", ()), ("avx2", ("avx2",)), ("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq")))


def kernel_sets(flags: set[str] | None = None) -> list[str]:
    """The CPU kernel sets this CPU can run, simplest first (``ATEN_CPU_CAPABILITY`` picks one;
    the portability check runs the suite under each): read from ``/proc/cpuinfo``'s flags."""
    if flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
        except OSError:
            flags = set()
    return [name for name, needs in _KERNEL_SETS if all(flag in flags for flag in needs)]


def rank_core(local_rank: int, local_world: int, cores: list[int]) -> int | None:
    """The core for ``local_rank`` of ``local_world`` ranks on ``cores``; None: not pinned."""
    n = len(cores)
    if n == 0 or local_world <= n:
        return None
    return cores[(local_rank + local_rank // n) % n]


#: the cores this process could run on before ``pin_rank``, and the core it pinned to (empty: not pinned)
_BEFORE: list[int] = []
_CORE: list[int] = []


def pin_rank(local_rank: int, local_world: int) -> int | None:
    """Pin every thread of this process (and what it starts later) to the rank's core; the
    core, or None where nothing was pinned (enough cores, or no affinity control here)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    core = rank_core(local_rank, local_world, sorted(before))
    if core is None:
        return None
    _BEFORE[:] = sorted(before)
    _CORE[:] = [core]
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, {core})
        except OSError:  # a thread that ended meanwhile
            pass
    return core


def unpin() -> bool:
    """Let this process run on the cores it had before ``pin_rank`` again; False: it was not pinned."""
    return _run_on(_BEFORE)


def repin() -> bool:
    """Pin this process to the core ``pin_rank`` chose again (after ``unpin``); False: it was not pinned."""
    return _run_on(_CORE)


def _run_on(cores: list[int]) -> bool:
    """This thread on ``cores`` (a zygote and what it forks have no other); False: none given, or refused."""
    if not cores:
        return False
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        return False
    return True
