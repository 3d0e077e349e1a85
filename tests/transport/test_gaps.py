"""Issue 27, observation 14: sequence counters (``gaps``) followed self-declared sender ids:
invented ids pushed a replay shard's counter to 3.2e13, and a forged ``s=actor-0`` reset the
real sender's sequence. Counters follow expected peers only (the run's planned roles, or the
connection on a ROUTER), and a forged low number cannot reset a real sequence."""

from __future__ import annotations

import zmq

from tests.helpers.replay import replay_config
from zrl.roles.replay import ReplayServer
from zrl.testing.fakes import trajectory
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.senders import planned_ids
from zrl.transport.sockets import MAX_SEQ_JUMP, Channel, TransportStats, make_socket


def forged(sender: str, seq: int) -> list[bytes]:
    msg = P.Message(P.TRAJECTORY, arrays=trajectory(), sender=sender, seq=seq, stream="experience")
    return [bytes(f) if not isinstance(f, bytes) else f for f in P.encode(msg)]


def test_invented_and_forged_sender_ids_move_no_gap_counter_of_a_replay_shard(inproc):
    cfg = replay_config(capacity=1000, min_size=1000)  # no sampling: every insert is taken
    inproc.start_broker(cfg)
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    actor = inproc.push("experience", sender="actor-0")
    attacker = inproc.push("experience", sender="x")
    stream = replay.stats.stream("experience")
    for _ in range(3):
        assert actor.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    wait_for(lambda: replay.trajectories_received == 3, timeout=30)
    # Invented ids, each jumping as far as a sequence may (each pair was 2**32 gaps), and a
    # forged restart of the real actor's sequence.
    for i in range(20):
        attacker.sock.send_multipart(forged(f"ghost-{i}", 0))
        attacker.sock.send_multipart(forged(f"ghost-{i}", MAX_SEQ_JUMP))
    attacker.sock.send_multipart(forged("actor-0", 0))
    wait_for(lambda: replay.trajectories_received + stream.dropped >= 44, timeout=30)
    for _ in range(2):  # the real actor goes on: 3, 4
        assert actor.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    wait_for(lambda: replay.trajectories_received + stream.dropped >= 46, timeout=30)
    assert stream.gaps == 0
    assert set(stream.last_seq) <= planned_ids(cfg.roles.counts())
    assert stream.last_seq["actor-0"] == 4


def test_router_sequences_follow_the_connection_not_the_named_sender(zmq_ctx):
    router = make_socket(zmq_ctx, zmq.ROUTER)
    router.bind("inproc://gaps-router")
    rx = Channel(router, "rpc", "params-0", TransportStats(), envelope=True)
    peers = []
    try:
        for _ in range(2):
            sock = make_socket(zmq_ctx, zmq.DEALER)
            sock.connect("inproc://gaps-router")
            peers.append(sock)
        # The same claimed id from two connections, each numbering from 0: no gap, no reset.
        for seq in range(3):
            for sock in peers:
                sock.send_multipart(P.encode(P.Message(P.GET_WEIGHTS, sender="learner-0", seq=seq)))
        got = [rx.recv() for _ in range(6)]
        assert all(g is not None for g in got)
        assert rx.stats.gaps == 0 and len(rx.stats.last_seq) == 2
        assert all(key.startswith("@") for key in rx.stats.last_seq)
    finally:
        for sock in peers:
            sock.close(linger=0)
        rx.close()
