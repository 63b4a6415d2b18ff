"""How the ranks of a cell agree on its outcome (``harness.rank.peers``): outcomes through the
store, the root cause a record blames, and the collective sockets a failed rank shuts."""

import os
import socket
import time

import pytest
import torch.distributed as dist

from harness.protocol import CellKeys
from harness.rank import peers
from harness.rank.peers import RankOutcome, blame, collect_outcomes, post

KEYS = CellKeys(launch_id="L1", index=4)


def _failed(rank, exc_type="RuntimeError", msg="boom", t=1.0, **kw):
    return RankOutcome(rank=rank, ok=False, exc_type=exc_type, exc_msg=msg, traceback=f"tb{rank}", t_fail=t, **kw)


def _timeout(rank, phase, *, in_collective, t=1.0):
    return _failed(rank, "CellTimeout", f"the cell's deadline passed in {phase!r}", t, phase=phase,
                   where=f"wait{rank} (x.py:{rank})", in_collective=in_collective)


LOST = "Connection closed by peer [127.0.0.1]:1234"


# --------------------------------------------------------------------------- through the store


def test_posted_outcomes_come_back_in_rank_order():
    store = dist.HashStore()
    one = _failed(1, "ValueError", "bad", 12.5, phase="step 0 clip", where="f (x.py:3)", in_collective=True)
    post(store, KEYS, one)
    post(store, KEYS, RankOutcome(rank=0, ok=True))
    outcomes, missing = collect_outcomes(store, KEYS, 2, timeout_s=5.0)
    assert outcomes == [RankOutcome(rank=0, ok=True), one] and missing == []


def test_a_rank_that_never_reported_is_missing_after_the_timeout():
    store = dist.HashStore()
    post(store, KEYS, RankOutcome(rank=0, ok=True))
    post(store, KEYS, RankOutcome(rank=2, ok=True))
    post(store, CellKeys(launch_id="L1", index=5), RankOutcome(rank=1, ok=True))  # another cell's report
    t = time.time()
    outcomes, missing = collect_outcomes(store, KEYS, 3, timeout_s=1.0)
    assert [o.rank for o in outcomes] == [0, 2] and missing == [1]
    assert time.time() - t < 4.0


@pytest.mark.parametrize("msg,comm,timed", [
    (LOST, True, False), ("Connection reset by peer", True, False), ("[Broken pipe]", True, False),
    ("Timed out waiting 1800000ms for recv operation to complete", False, True), ("gloo timeout after 5 s", False, True),
    ("size mismatch", False, False), (None, False, False),
])
def test_outcome_kinds(msg, comm, timed):
    o = _failed(0, msg=msg)
    assert (o.comm_failure, o.timed_out) == (comm, timed)


def test_cell_timeout_is_a_timeout_whatever_its_message():
    assert _failed(0, "CellTimeout", "the cell's deadline passed in 'init group'").timed_out


def test_connect_store_joins_the_agents_store(monkeypatch):
    """Under torchrun's agent store (and for a forked cell: ``client_only``) rank 0 is a client."""
    agent = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    peers.connect_store(2).set("a", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    peers.connect_store(2, client_only=True).set("b", "2")
    assert agent.get("a") == b"1" and agent.get("b") == b"2"


@pytest.mark.parametrize("agent,client_only,rank,hosts", [
    ("true", False, "0", False), ("", False, "0", True), ("", True, "0", False), ("", False, "1", False),
])
def test_connect_store_hosts_only_on_rank_0_without_an_agent(monkeypatch, agent, client_only, rank, hosts):
    made = []
    monkeypatch.setattr(peers.dist, "TCPStore", lambda *a, **kw: made.append((a, kw)))
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent)
    peers.connect_store(4, client_only=client_only)
    [(args, kw)] = made
    assert args == ("10.0.0.1", 29400, 4) and kw["is_master"] is hosts and kw["wait_for_workers"] is False


# --------------------------------------------------------------------------- blame


def test_a_ranks_own_error_beats_an_earlier_lost_connection():
    fields = blame([_failed(0, msg=LOST, t=1.0), _failed(1, "ValueError", "bad shape", t=2.0)], {}, 6.0)
    assert fields.status == "error" and fields.failing_rank == 1
    assert (fields.exc_type, fields.exc_msg, fields.traceback) == ("ValueError", "bad shape", "tb1")
    assert fields.failed_ranks == [0, 1]
    assert fields.rank_errors == {"0": f"RuntimeError: {LOST}", "1": "ValueError: bad shape"}


def test_the_first_own_error_wins_and_ties_go_to_the_lower_rank():
    fields = blame([RankOutcome(rank=0, ok=True), _failed(2, t=3.0), _failed(3, t=3.0), _failed(1, t=5.0)], {}, 6.0)
    assert fields.failing_rank == 2 and fields.failed_ranks == [1, 2, 3]


def test_only_lost_connections_blame_the_first_to_lose_it():
    fields = blame([_failed(0, msg=LOST, t=2.0), _failed(1, msg="Connection reset by peer", t=1.0)], {}, 6.0)
    assert (fields.status, fields.failing_rank) == ("error", 1)


def test_a_rank_killed_by_a_signal_is_the_crash():
    died = _failed(1, "Signal", "rank 1 died: signal 6 (SIGABRT)", t=2.0)
    fields = blame([_failed(0, msg=LOST, t=1.0), died, _failed(2, "ValueError", t=0.5)], {}, 6.0)
    assert (fields.status, fields.exc_type, fields.failing_rank) == ("crash", "Signal", 1)
    assert fields.exc_msg == "rank 1 died: signal 6 (SIGABRT)" and fields.failed_ranks == [0, 1, 2]


def test_of_two_ranks_killed_the_first_is_the_crash():
    fields = blame([_failed(0, "Signal", "rank 0 died: signal 9 (SIGKILL)", t=4.0),
                    _failed(1, "Signal", "rank 1 died: signal 6 (SIGABRT)", t=3.0)], {}, 6.0)
    assert (fields.failing_rank, fields.exc_msg) == (1, "rank 1 died: signal 6 (SIGABRT)")


def test_a_rank_that_never_reported_is_blamed_for_the_hang():
    waiting = _timeout(0, "step 1 micro-batch 0 backward", in_collective=True)
    fields = blame([waiting], {1: "step 2 clip"}, 6.0)  # never reported: blamed, wherever it was
    assert (fields.status, fields.exc_type, fields.failing_rank) == ("hang", "CellTimeout", 1)
    assert fields.failed_ranks == [0, 1] and fields.traceback is None
    assert fields.exc_msg == (
        "no result within 6 s: rank(s) [1] did not arrive (rank 0 waited in a collective in wait0 (x.py:0) "
        "during 'step 1 micro-batch 0 backward'; rank 1 never reported (last in 'step 2 clip'))")


def test_an_own_error_beats_a_rank_that_never_reported():
    fields = blame([_failed(0, "ValueError", "bad")], {1: None}, 6.0)
    assert (fields.status, fields.failing_rank, fields.failed_ranks) == ("error", 0, [0, 1])


def test_a_rank_stuck_in_its_own_code_is_blamed_over_one_waiting_in_a_collective():
    own = _timeout(1, "step 0 clip", in_collective=False)
    fields = blame([_timeout(0, "step 0 micro-batch 0 forward", in_collective=True), own], {}, 6.0)
    assert (fields.status, fields.failing_rank, fields.traceback) == ("hang", 1, "tb1")
    assert fields.exc_msg.startswith("no result within 6 s: rank(s) [1] did not arrive (")
    assert "rank 1 was in wait1 (x.py:1) during 'step 0 clip'" in fields.exc_msg


def test_ranks_all_in_collectives_blame_the_one_furthest_behind():
    outcomes = [_timeout(0, "step 1 clip", in_collective=True),
                _timeout(1, "step 0 micro-batch 1 backward", in_collective=True),
                _failed(2, msg=LOST, phase="step 1 clip")]
    fields = blame(outcomes, {}, 6.0)
    assert (fields.status, fields.failing_rank) == ("hang", 1)
    assert "rank(s) [1] did not arrive" in fields.exc_msg and "rank 2 lost its peers during 'step 1 clip'" in fields.exc_msg


def test_ranks_at_the_same_place_are_all_named():
    fields = blame([_timeout(r, "step 0 clip", in_collective=True) for r in (0, 1)], {}, 2.5)
    assert (fields.status, fields.failing_rank) == ("hang", 0)
    assert fields.exc_msg.startswith("no result within 2.5 s: rank(s) [0, 1] (rank 0 waited")


def test_one_rank_that_timed_out_is_the_hang():
    fields = blame([_timeout(0, "step 0 micro-batch 0 forward", in_collective=False)], {}, 6.0)
    assert (fields.status, fields.failing_rank, fields.failed_ranks) == ("hang", 0, [0])
    assert fields.exc_msg == ("no result within 6 s: rank(s) [0] (rank 0 was in wait0 (x.py:0) during "
                                 "'step 0 micro-batch 0 forward')")


def test_a_crash_counts_a_rank_that_never_reported_as_failed():
    fields = blame([_failed(0, "Signal", "rank 0 died: signal 6 (SIGABRT)")], {1: "step 0 clip"}, 6.0)
    assert fields.status == "crash" and fields.failed_ranks == [0, 1]


# --------------------------------------------------------------------------- sockets


def test_shutdown_peer_sockets_spares_the_store_connection(monkeypatch):
    """The store's connection (MASTER_PORT) stays usable; a collective's connection is shut, so a
    peer blocked on it sees the end at once; a listener and a Unix socket are left alone."""
    servers, clients = [], []
    for _ in range(2):
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        servers.append((srv, conn))
        clients.append(cli)
    (store_srv, store_conn), (peer_srv, peer_conn) = servers
    store_cli, peer_cli = clients
    unix_a, unix_b = socket.socketpair()
    sockets = [store_srv, store_conn, peer_srv, peer_conn, store_cli, peer_cli, unix_a, unix_b]
    ours = {str(s.fileno()) for s in (store_cli, peer_cli, peer_srv, unix_a)}
    real_listdir = os.listdir
    # only this test's sockets: the test process may hold connections of its own
    monkeypatch.setattr(peers.os, "listdir", lambda p: [fd for fd in real_listdir(p) if fd in ours]
                        if p == "/proc/self/fd" else real_listdir(p))
    monkeypatch.setenv("MASTER_PORT", str(store_srv.getsockname()[1]))
    try:
        assert peers.shutdown_peer_sockets() is True
        peer_conn.settimeout(5)
        assert peer_conn.recv(16) == b""  # the peer sees the connection end
        with pytest.raises(OSError):
            peer_cli.sendall(b"x")
        store_cli.sendall(b"ping")
        store_conn.settimeout(5)
        assert store_conn.recv(16) == b"ping"
        unix_a.sendall(b"u")
        assert unix_b.recv(1) == b"u"
        late = socket.create_connection(peer_srv.getsockname(), timeout=5)  # the listener still accepts
        sockets.append(late)
        peer_srv.settimeout(5)
        sockets.append(peer_srv.accept()[0])
    finally:
        for s in sockets:
            s.close()


def test_shutdown_peer_sockets_without_connections_says_so(monkeypatch):
    monkeypatch.setattr(peers.os, "listdir", lambda p: [])
    assert peers.shutdown_peer_sockets() is False
