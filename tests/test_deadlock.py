"""harness.rank.deadlock: a hang found before the deadline only where it is certain."""

import gc
import json
import subprocess
import sys
import textwrap
import threading
import types

import pytest

from harness.rank import deadlock
from tests.support import ROOT


def _slot(tmp_path, n_peers=2):
    peers = [(tmp_path / f"r{r}.done", tmp_path / f"r{r}.quiet") for r in range(1, n_peers + 1)]
    return deadlock.Slot(cell=7, own=tmp_path / "r0.quiet", peers=peers), peers


def test_a_look_leaves_nothing_for_the_collector():
    """sys._current_frames() holds the looking frame itself. Kept in a local past the return, the
    dict and that frame formed a cycle with the main thread's frames: collected, it cleared a
    DTensor still held as a param's grad on torch 2.7-2.9 ('DTensor' object has no attribute '_spec')."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        looked = threading.Thread(target=deadlock._look, args=(threading.get_ident(), None))
        looked.start()
        looked.join()
        deadlock._look(threading.get_ident(), None)  # from the main thread too
        gc.collect()
        looking = (deadlock._look.__code__, deadlock._innermost.__code__)
        left = [o for o in gc.garbage if isinstance(o, types.FrameType) and o.f_code in looking]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


def test_certain_only_when_this_rank_and_every_peer_have_been_quiet_long_enough(tmp_path, monkeypatch):
    slot, peers = _slot(tmp_path)
    look = ("frame", 10, 5)
    monkeypatch.setattr(deadlock, "_look", lambda frame, tid: look)
    clock = [1000.0]
    monkeypatch.setattr(deadlock.time, "time", lambda: clock[0])
    peers[0][0].write_text("7")  # posted this cell
    peers[1][1].write_text(f"7 {clock[0] - 5} {clock[0]}")  # quiet in this cell for 5 s, as of now
    assert not slot.certain(None, None)  # the first quiet look starts the clock
    clock[0] += 0.5
    assert not slot.certain(None, None) and (tmp_path / "r0.quiet").read_text() == "7 1000.0 1000.5"
    clock[0] += 0.6
    peers[1][1].write_text(f"7 {clock[0] - 5} {clock[0] - 0.9}")
    assert not slot.certain(None, None)  # that peer's last look is 0.9 s old: stale, it may be running now
    peers[1][1].write_text(f"7 {clock[0] - 5} {clock[0] - 0.2}")
    assert slot.certain(None, None)
    peers[1][1].write_text(f"7 {clock[0] - 0.3} {clock[0]}")  # that peer only just went quiet
    assert not slot.certain(None, None)
    peers[1][1].write_text(f"6 {clock[0] - 5} {clock[0]}")  # quiet, but in the cell before
    assert not slot.certain(None, None)
    peers[1][1].write_text(f"7 {clock[0] - 5} {clock[0]}")
    slot.away()  # left user code: its note is gone, and so is its quiet stretch
    assert (tmp_path / "r0.quiet").read_text() == "" and not slot.certain(None, None)
    clock[0] += 1.1
    peers[1][1].write_text(f"7 {clock[0] - 5} {clock[0]}")
    assert slot.certain(None, None)
    look = ("frame", 11, 5)  # this rank moved: quiet from now on, not before
    assert not slot.certain(None, None)
    look = None  # not quiet at all: its file says so
    assert not slot.certain(None, None) and (tmp_path / "r0.quiet").read_text() == ""


def _two_ranks(tmp_path, body: str, timeout_s: float = 8.0) -> list[dict]:
    """Two gloo ranks running ``body`` (rank, dist in scope) under a watchdog that looks at the
    slot; each prints what happened as JSON."""
    script = textwrap.dedent(f"""
        import json, os, sys, time, datetime
        sys.path.insert(0, {str(ROOT)!r})
        rank = int(sys.argv[1])
        import torch, torch.distributed as dist
        from harness.rank import deadlock, peers
        from harness.rank.watchdog import CellTimeout, Watchdog
        store = dist.FileStore({str(tmp_path / "store")!r}, 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
        files = [({str(tmp_path)!r} + f"/r{{r}}.done", {str(tmp_path)!r} + f"/r{{r}}.quiet") for r in range(2)]
        from pathlib import Path
        slot = deadlock.Slot(cell=1, own=Path(files[rank][1]), peers=[(Path(d), Path(q)) for r, (d, q) in enumerate(files) if r != rank])
        wd = Watchdog(None, on_expire=peers.unblock)
        t0 = time.time()
        wd.arm({timeout_s}, slot)
        try:
            with wd.user_code("step"):
    """) + textwrap.indent(textwrap.dedent(body), " " * 8) + textwrap.dedent("""
            out = dict(ok=True)
        except BaseException as e:
            out = dict(ok=False, error=type(e).__name__, deadlock=wd.deadlock)
        Path(files[rank][0]).write_text("1")
        out["after_s"] = time.time() - t0
        print(json.dumps(out), flush=True)
        os._exit(0)
    """)
    (tmp_path / "rank.py").write_text(script)
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "rank.py"), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, err[-3000:]
        outs.append(json.loads(lines[-1]))
    return outs


def test_ranks_waiting_in_different_collectives_are_ended_well_before_the_deadline(tmp_path):
    outs = _two_ranks(tmp_path, """
        t = torch.ones(4)
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=1)
            dist.broadcast(t, src=1)
    """)
    # the first rank to see it ends its part and shuts its sockets; a peer then fails at once too
    assert not any(o["ok"] for o in outs) and any(o["deadlock"] for o in outs), outs
    assert all(o["after_s"] < 5.0 for o in outs), outs  # the deadline is 8 s


@pytest.mark.parametrize("how", ["sleeps", "computes"])
def test_a_rank_waiting_for_a_slow_peer_is_never_taken_for_a_deadlock(tmp_path, how):
    # the peer takes 3 s before it joins: asleep in its own code, or busy
    outs = _two_ranks(tmp_path, f"""
        t = torch.ones(4)
        if rank == 1 and {how!r} == "sleeps":
            time.sleep(3)
        if rank == 1 and {how!r} == "computes":
            end = time.time() + 3
            while time.time() < end:
                torch.randn(64, 64) @ torch.randn(64, 64)
        dist.all_reduce(t)
        assert float(t[0]) == 2.0
    """)
    assert all(o["ok"] for o in outs), outs
    assert min(o["after_s"] for o in outs) >= 2.9  # it did wait for the peer


LOOP_THREAD = textwrap.dedent("""
    import json, select, socket, sys, threading, time
    sys.path.insert(0, {root!r})
    from harness.rank import deadlock
    # a look waits up to SETTLE_S (5 ms) for a runnable thread to sleep, then gives up (None): the loop's
    # 3 ms of work can take longer than that where other processes hold the cores (seen once under
    # pytest-xdist, one look of six None); what is tested here is which ticks count, not that wait
    deadlock.SETTLE_S = 0.1
    # the main thread's innermost frame as in a collective (only the threads and sockets are looked at here)
    deadlock._innermost = lambda main_tid: ((1, 1, "/x/torch/distributed/distributed_c10d.py"), False)
    mode = sys.argv[1]
    server = socket.create_server(("127.0.0.1", 0))
    out = socket.create_connection(server.getsockname())
    inp, _ = server.accept()

    def loop():  # an I/O loop as gloo's: wakes every 10 ms, here spending 3 ms of CPU each time
        ep = select.epoll()
        while True:
            if mode == "sleeps":  # asleep elsewhere than in epoll_wait: its ticks count
                time.sleep(0.01)
            else:
                ep.poll(0.01)
            end = time.thread_time() + 0.003
            while time.thread_time() < end:
                pass
            if mode == "moves data":  # a byte out and in again each time
                out.send(b"x")
                inp.recv(64)

    threading.Thread(target=loop, daemon=True).start()
    looks = []

    def watchdog():
        time.sleep(0.3)
        for _ in range(6):
            looks.append(deadlock._look(threading.main_thread().ident, threading.get_native_id()))
            time.sleep(deadlock.LOOK_S)
        done.set()

    done = threading.Event()
    threading.Thread(target=watchdog).start()
    done.wait()
    print(json.dumps(dict(none=sum(x is None for x in looks), distinct=len({{repr(x) for x in looks}}))))
""")


@pytest.mark.parametrize("mode", ["polls", "moves data", "sleeps"])
def test_an_io_loops_idle_polls_do_not_break_a_quiet_stretch_but_its_traffic_or_other_work_does(tmp_path, mode):
    (tmp_path / "loop.py").write_text(LOOP_THREAD.format(root=str(ROOT)))
    res = subprocess.run([sys.executable, str(tmp_path / "loop.py"), mode], capture_output=True, text=True, timeout=60)
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    if mode == "polls":  # asleep in epoll_wait at each look, ticks charged, no byte moved: one quiet look throughout
        assert seen == {"none": 0, "distinct": 1}, seen
    else:  # bytes moved, or a thread not in epoll_wait spent CPU: the looks differ
        assert seen["distinct"] > 1 or seen["none"] == 6, seen
