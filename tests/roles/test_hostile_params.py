"""Issue 27 against the parameter server and its followers, replayed through the real roles:
layouts fixed at setup, WEIGHTS only from the registered learner, bounded replies, and a
follower that drops a forged jump at the next real version."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from tests.helpers.params import (
    TinyModel,
    assert_same_arrays,
    config,
    connected,
    model_arrays,
    weights,
)
from zrl.roles.base import Role
from zrl.roles.learner import Learner
from zrl.roles.params import REPLY_HWM, Layout, ParameterServer
from zrl.roles.registry_client import read_status
from zrl.roles.weights import RESYNC_INTERVAL_S, WeightsFollower
from zrl.run.learning import MIN_SENT, did_not_learn
from zrl.testing.fakes import Rpc
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel, ReplyBudget, TransportStats, make_socket

torch.set_num_threads(1)


@pytest.fixture
def params(inproc) -> ParameterServer:
    inproc.start_broker(config())
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    return ps


def test_one_forged_weights_message_cannot_lock_params(inproc, params, zmq_ctx):
    # Observation 1: {'x': [1.0]} sent as params registers became v1 and every real update
    # was then refused. Now the layout comes from the config's model and the sender from the
    # registry, before the first message.
    stranger = Rpc(zmq_ctx, params.rpc_endpoint)  # reaches the port, never registered
    actor = Rpc(zmq_ctx, params.rpc_endpoint, sender="actor-0", broker=inproc.addr)
    extra = Rpc(zmq_ctx, params.rpc_endpoint, sender="learner-3", broker=inproc.addr)
    try:
        attack = [
            (stranger, P.Message(P.WEIGHTS, arrays={"x": np.ones(1, np.float32)})),
            (stranger, P.Message(P.WEIGHTS, arrays={"evil": np.zeros(2**21, np.float32)})),
            (stranger, P.Message(P.WEIGHTS, arrays=weights(1))),  # right layout, no identity
            (stranger, P.Message(P.RESET, meta={"resets": 5})),
            (actor, P.Message(P.WEIGHTS, arrays=weights(2))),  # registered, not a learner
            (extra, P.Message(P.WEIGHTS, arrays=weights(3))),  # a learner the config lacks
        ]
        for rpc, msg in attack:
            rpc.send(msg)
        wait_for(lambda: params.weights_refused == len(attack), timeout=10)
        assert params.stats.snapshot()["rpc"]["dropped"] == len(attack)
        assert params.version == 0 and not params.arrays
        assert params.streams["main"].resets == 0
        for rpc in (stranger, actor, extra):
            assert rpc.ch.recv(block=False) is None  # nothing acknowledged

        # The run's own learner, started after the attack, publishes v1 and trains on.
        learner = inproc.start(Learner, index=0)
        assert isinstance(learner, Learner)
        wait_for(lambda: learner.weights_acked >= 1 and params.version >= 1, timeout=15)
        assert set(params.arrays) == set(weights(0))
        assert params.heartbeat_info()["weights_refused"] == len(attack)
        # A learner restart (a new connection, a new key) is taken too; the stranger still not.
        learner.params_acked = False
        stranger.send(P.Message(P.WEIGHTS, arrays=weights(4)))
        wait_for(lambda: params.weights_refused == len(attack) + 1, timeout=10)
    finally:
        for rpc in (stranger, actor, extra):
            rpc.close()


def test_replies_to_peers_that_never_read_are_bounded(params, zmq_ctx, inproc):
    # Observation 6: 50 peers asking for weights took params from 173 MB to 1 GB. Each peer
    # now holds at most REPLY_HWM replies in params (plus what its own socket takes); the
    # rest are dropped and counted. A queued reply shares the stored arrays (no copy).
    learner = Rpc(zmq_ctx, params.rpc_endpoint, broker=inproc.addr)
    peers: list[Channel] = []
    try:
        w = weights(1)
        assert learner.request(P.Message(P.WEIGHTS, arrays=w)).meta["version"] == 1
        peer_rcvhwm, asks = 1, 20
        for i in range(50):
            sock = make_socket(zmq_ctx, zmq.DEALER, rcvhwm=peer_rcvhwm)
            sock.connect(params.rpc_endpoint)
            peers.append(Channel(sock, "rpc", f"mallory-{i}", TransportStats()))
        for ch in peers:
            for _ in range(asks):
                assert ch.send(P.Message(P.GET_WEIGHTS))
        wait_for(lambda: params.served == 50 * asks, timeout=20)
        delivered = params.served - params.replies_dropped
        # inproc: a pipe holds the sender's HWM plus the reader's; over TCP the kernel buffer
        # (REPLY_KERNEL_BUFFER_BYTES) takes the reader's place.
        per_peer = REPLY_HWM + peer_rcvhwm
        assert delivered <= 50 * per_peer, (delivered, params.replies_dropped)
        assert params.replies_dropped >= 50 * (asks - per_peer)
        weights_bytes = sum(a.nbytes for a in w.values())
        queued_bound = 50 * per_peer * weights_bytes
        assert delivered * weights_bytes <= queued_bound
        # The server still answers a peer that reads.
        latest = learner.request(P.Message(P.GET_WEIGHTS))
        assert latest.kind == P.WEIGHTS and latest.meta["version"] == 1

        # In total too: past the reply budget's bytes (here ten replies' worth), every peer's
        # reply is dropped and counted, however many peers ask.
        reply_bytes = ReplyBudget.MIN_REPLY_CHARGE  # what a small reply counts for
        assert weights_bytes + 512 < reply_bytes
        params.reply_budget = ReplyBudget(
            per_peer_bytes=10 * reply_bytes, total_bytes=10 * reply_bytes, drain_s=60.0
        )
        served0, dropped0 = params.served, params.replies_dropped
        fresh = []
        for i in range(30):  # new peers: their own queues are empty
            sock = make_socket(zmq_ctx, zmq.DEALER, rcvhwm=peer_rcvhwm)
            sock.connect(params.rpc_endpoint)
            fresh.append(Channel(sock, "rpc", f"eve-{i}", TransportStats()))
        peers += fresh
        for ch in fresh:
            assert ch.send(P.Message(P.GET_WEIGHTS))
        wait_for(lambda: params.served == served0 + 30, timeout=20)
        assert params.replies_dropped - dropped0 == 20 == params.reply_budget.dropped
        assert params.reply_budget.queued <= 10 * reply_bytes
    finally:
        for ch in peers:
            ch.close()
        learner.close()


def at_version(follower: WeightsFollower, version: int) -> bool:
    follower.update()
    return follower.version == version


def test_follower_drops_a_forged_jump_at_the_next_real_version(inproc, params, zmq_ctx):
    # Observation 15: forged in-range weights every 0.5 s kept followers on garbage for 11 of
    # 15 evaluations, because a follower resynced at most every RESYNC_INTERVAL_S. A lower
    # real version after an adopted jump now asks params at once.
    learner = Rpc(zmq_ctx, params.rpc_endpoint, broker=inproc.addr)
    follower_role = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=5)
    try:
        follower_role.connect()
        model = TinyModel()
        follower = WeightsFollower(follower_role, model)
        inproc.wait_for_subscriber(P.WEIGHTS_TOPIC)
        assert learner.request(P.Message(P.WEIGHTS, arrays=weights(1))).meta["version"] == 1
        wait_for(lambda: at_version(follower, 1), timeout=5)
        forged = connected(inproc, follower, "params-0")
        started = time.monotonic()
        rounds = 3
        for real in range(2, 2 + rounds):
            # Forged: the real id, a version within the step, finite values: adopted ...
            forged.send(
                P.Message(P.WEIGHTS, meta={"version": real + 50}, arrays=weights(100 + real)),
                topic=P.WEIGHTS_TOPIC,
            )
            wait_for(lambda v=real + 50: at_version(follower, v), timeout=5)
            assert follower.unconfirmed_jump
            # ... until the next real version, which is lower: params' rpc is asked at once.
            ack = learner.request(P.Message(P.WEIGHTS, arrays=weights(real)))
            assert ack.meta["version"] == real
            wait_for(lambda v=real: at_version(follower, v), timeout=5)
            assert_same_arrays(model_arrays(model), weights(real))
        elapsed = time.monotonic() - started
        assert follower.resyncs == rounds
        # Three recoveries in less time than one slow resync interval would have allowed.
        assert elapsed < RESYNC_INTERVAL_S * (rounds - 1), elapsed
        # A lower version without a jump before it is not worth a fast resync.
        assert not follower.unconfirmed_jump
        forged.send(
            P.Message(P.WEIGHTS, meta={"version": 1}, arrays=weights(9)), topic=P.WEIGHTS_TOPIC
        )
        settle(lambda: follower.update() is False and follower.resyncs == rounds, 0.5)
    finally:
        follower_role.close()
        learner.close()


def test_a_learner_whose_weights_params_refuses_did_not_learn(inproc, monkeypatch):
    # "A run that did not learn says so": params refusing every update of the learner (here a
    # params whose expected layout is not the learner's) is what the head's rule sees in the
    # registry's rows, naming the learner.
    wrong: Layout = {"x": ((1,), np.dtype(np.float32))}
    monkeypatch.setattr(ParameterServer, "model_layout", lambda self: wrong)
    inproc.start_broker(config())
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(params, ParameterServer) and isinstance(learner, Learner)

    def learner_row() -> dict | None:
        rows = read_status(inproc.ctx, inproc.addr, 2.0)["roles"]
        row = next((r for r in rows if r.get("id") == "learner-0"), None)
        return row if row and row["info"].get("weights_sent", 0) >= MIN_SENT else None

    wait_for(learner_row, timeout=20)
    rows = read_status(inproc.ctx, inproc.addr, 2.0)["roles"]
    reason = did_not_learn(config(), rows)
    assert reason is not None and reason.startswith("learner-0 did not learn"), reason
    assert learner.weights_acked == 0 and params.version == 0
    assert params.weights_refused >= MIN_SENT
