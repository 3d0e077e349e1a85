"""Fault injection for tests (``ZRL_TESTING_FAULTS``): rule parsing, and what a ``Channel``
with active faults does to the messages it sends.

Every socket here lives on the test's own zmq context over ``inproc://`` with linger 0 and
finite timeouts; the module-level rule list (``sockets._FAULTS``) is monkeypatched, so nothing
leaks into other tests.
"""

from __future__ import annotations

import itertools
import random
import re
import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from zrl.testing.probes import wait_subscribed
from zrl.transport import protocol as P
from zrl.transport import sockets as S
from zrl.transport.sockets import FAULTS_ENV, Channel, Fault, TransportStats, make_socket

_names = itertools.count()


# --- parse_faults ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("trajectory:drop:0.05", [Fault("trajectory", "drop", 0.05)]),
        ("weights:delay:0.2:0.5", [Fault("weights", "delay", 0.2, 0.5)]),
        ("*:drop:1", [Fault("*", "drop", 1.0)]),
        ("*:delay:0:3", [Fault("*", "delay", 0.0, 3.0)]),
        (
            "trajectory:drop:0.05,weights:delay:0.2:0.5",
            [Fault("trajectory", "drop", 0.05), Fault("weights", "delay", 0.2, 0.5)],
        ),
        # Blanks around rules and empty rules are ignored.
        (
            " batch:drop:1e-3 , ,ack:delay:1.0:0.01, ",
            [
                Fault("batch", "drop", 0.001),
                Fault("ack", "delay", 1.0, 0.01),
            ],
        ),
        ("", []),
        (" , ", []),
    ],
)
def test_parse_faults_valid_rules(spec, expected):
    assert S.parse_faults(spec) == expected


BAD_RULES = [
    "trajectory",  # no action
    "trajectory:drop",  # no probability
    "trajectory:drop:",  # empty probability
    "trajectory:drop:abc",  # not a number
    "trajectory:drop:0.1:2",  # drop takes no seconds
    "trajectory:delay:0.1",  # delay needs seconds
    "trajectory:delay:0.1:x",
    "trajectory:delay:0.1:1:2",
    "trajectory:explode:0.1",  # unknown action
    "trajectory:DROP:0.1",  # actions are lower case
]


@pytest.mark.parametrize("rule", BAD_RULES)
def test_parse_faults_names_the_bad_rule(rule):
    with pytest.raises(ValueError) as err:
        S.parse_faults(rule)
    msg = str(err.value)
    assert msg.startswith(FAULTS_ENV)
    assert repr(rule) in msg
    assert "kind:drop:P or kind:delay:P:SECONDS" in msg


def test_parse_faults_names_the_bad_rule_among_good_ones():
    with pytest.raises(ValueError, match=re.escape("'weights:delay:0.5'")):
        S.parse_faults("trajectory:drop:0.1, weights:delay:0.5 ,batch:drop:0.2")


@pytest.mark.parametrize(
    "rule",
    ["x:drop:1.5", "x:drop:-0.1", "x:delay:2:0.1", "x:delay:-1e-9:0.1", "x:drop:nan", "x:drop:inf"],
)
def test_parse_faults_probability_must_be_in_unit_interval(rule):
    with pytest.raises(ValueError) as err:
        S.parse_faults(f"ok:drop:0.5,{rule}")
    msg = str(err.value)
    assert "probability out of [0, 1]" in msg
    assert repr(rule) in msg


@pytest.mark.parametrize("rule", ["x:delay:0.5:-1", "x:delay:0.5:nan", "x:delay:0.5:inf"])
# Regression (found here, since fixed): sockets.py parse_faults: delay seconds are not validated;
# a negative or NaN delay makes every matching Channel.send raise ValueError from time.sleep, inf
# overflows
def test_parse_faults_rejects_bad_delay_seconds(rule):
    with pytest.raises(ValueError, match=re.escape(repr(rule))):
        S.parse_faults(rule)


def test_active_faults_are_read_once_per_process(monkeypatch):
    monkeypatch.setattr(S, "_FAULTS", None)
    monkeypatch.setenv(FAULTS_ENV, "trajectory:drop:0.25")
    assert S.active_faults() == [Fault("trajectory", "drop", 0.25)]
    # Changing the environment later changes nothing: the rules were read once.
    monkeypatch.setenv(FAULTS_ENV, "*:drop:1")
    assert S.active_faults() == [Fault("trajectory", "drop", 0.25)]
    monkeypatch.setattr(S, "_FAULTS", None)
    monkeypatch.delenv(FAULTS_ENV)
    assert S.active_faults() == []


def test_active_faults_bad_environment_fails_loudly(monkeypatch):
    monkeypatch.setattr(S, "_FAULTS", None)
    monkeypatch.setenv(FAULTS_ENV, "trajectory:drop:2")
    with pytest.raises(ValueError, match=re.escape("'trajectory:drop:2'")):
        S.active_faults()


# --- a Channel with active faults -------------------------------------------------------------


@pytest.fixture
def faults(monkeypatch) -> Iterator[list[Fault]]:
    """The rule list every Channel of this process consults; tests fill it in."""
    rules: list[Fault] = []
    monkeypatch.setattr(S, "_FAULTS", rules)
    yield rules


class Pipe:
    """A PUSH Channel to a PULL Channel over inproc, deep enough to hold a whole test run."""

    def __init__(self, ctx: zmq.Context, depth: int = 20_000) -> None:
        addr = f"inproc://zrl-test-faults-{next(_names)}"
        pull = make_socket(ctx, zmq.PULL, rcvhwm=depth, rcvtimeo_ms=200)
        pull.bind(addr)
        push = make_socket(ctx, zmq.PUSH, sndhwm=depth, sndtimeo_ms=1000)
        push.connect(addr)
        self.tx = Channel(push, "experience", "actor-0", TransportStats())
        self.rx = Channel(pull, "experience", "replay-0", TransportStats())

    def drain(self) -> list[P.Message]:
        out = []
        while (got := self.rx.recv()) is not None:  # the last wait ends at the 200 ms timeout
            out.append(got[1])
        return out

    def close(self) -> None:
        self.tx.close()
        self.rx.close()


@pytest.fixture
def pipe(zmq_ctx) -> Iterator[Pipe]:
    p = Pipe(zmq_ctx)
    try:
        yield p
    finally:
        p.close()


def small(kind: str, i: int) -> P.Message:
    return P.Message(kind, meta={"i": i}, arrays={"x": np.full(3, i, np.float32)})


def test_drop_rule_drops_its_kind_with_its_probability(faults, pipe):
    p, seed = 0.3, 20240611
    faults.append(Fault(P.TRAJECTORY, "drop", p))
    random.seed(seed)
    # Message i is a trajectory for odd i; the stream starts and ends with an unaffected
    # batch so that no drop happens before the first or after the last received message
    # (a receiver can only see a gap between two messages it did receive).
    n = 4001
    kinds = [P.TRAJECTORY if i % 2 else P.BATCH for i in range(n)]
    for i, kind in enumerate(kinds):
        assert pipe.tx.send(small(kind, i))
    got = pipe.drain()

    # Every send counted as sent, dropped or not; each used up its sequence number.
    assert pipe.tx.stats.sent == n and pipe.tx.next_seq == n
    seqs = [m.seq for m in got]
    assert seqs == sorted(seqs) and [m.meta["i"] for m in got] == seqs
    missing = sorted(set(range(n)) - set(seqs))
    # Only trajectories are lost; every other kind arrives.
    assert all(kinds[i] == P.TRAJECTORY for i in missing)
    assert sum(m.kind == P.BATCH for m in got) == kinds.count(P.BATCH)
    # The share lost is the rule's probability (binomial: within 5 standard deviations).
    n_traj = kinds.count(P.TRAJECTORY)
    drops = len(missing)
    assert abs(drops - p * n_traj) < 5 * (n_traj * p * (1 - p)) ** 0.5, drops
    # With this seed exactly these draws decide: one random() per matching send, in order.
    random.seed(seed)
    expected = [i for i in range(n) if kinds[i] == P.TRAJECTORY and random.random() < p]
    assert missing == expected
    # The receiver counts exactly the drops as sequence gaps; nothing counts as malformed.
    rx = pipe.rx.stats
    assert rx.gaps == drops
    assert rx.received == n - drops
    assert rx.dropped == 0


def test_drop_rule_for_every_kind_and_probability_zero(faults, pipe):
    faults.append(Fault("*", "drop", 1.0))
    for i, kind in enumerate([P.TRAJECTORY, P.BATCH, P.WEIGHTS, "anything"]):
        assert pipe.tx.send(small(kind, i))
    assert pipe.drain() == []
    assert pipe.tx.stats.sent == 4 and pipe.tx.next_seq == 4
    faults[:] = [Fault("*", "drop", 0.0)]
    for i in range(4, 104):
        assert pipe.tx.send(small(P.BATCH, i))
    got = pipe.drain()
    assert [m.seq for m in got] == list(range(4, 104))
    # A sender's first 4 messages lost before anything arrived are invisible to the receiver.
    assert pipe.rx.stats.gaps == 0 and pipe.rx.stats.received == 100


def test_drop_rule_on_a_topic_channel_counts_gaps_per_topic(faults, zmq_ctx):
    """Topics are numbered separately: drops on ``weights`` are gaps for its subscriber only."""
    p, seed = 0.5, 7
    faults.append(Fault(P.WEIGHTS, "drop", p))
    random.seed(seed)
    addr = f"inproc://zrl-test-faults-{next(_names)}"
    pub_sock = make_socket(zmq_ctx, zmq.PUB, sndhwm=10_000)
    pub_sock.bind(addr)
    pub = Channel(pub_sock, "weights", "params-0", TransportStats(), topics=True)
    subs: dict[str, Channel] = {}
    try:
        for topic in (P.WEIGHTS_TOPIC, P.METRICS_TOPIC):
            s = make_socket(zmq_ctx, zmq.SUB, rcvhwm=10_000, rcvtimeo_ms=200)
            s.setsockopt(zmq.SUBSCRIBE, topic.encode())
            s.connect(addr)
            subs[topic] = Channel(s, topic, "sub", TransportStats(), topics=True)
        for topic, ch in subs.items():  # subscriptions reach the PUB (raw probes: not counted)
            wait_subscribed(pub_sock, ch, topic)
        n = 1000
        # A weights message first and last with the rule switched off, so every drop lies
        # between two received ones.
        sent_weights = []
        for i in range(n):
            kind = P.WEIGHTS if i % 2 else P.METRICS
            topic = P.WEIGHTS_TOPIC if kind == P.WEIGHTS else P.METRICS_TOPIC
            edge = kind == P.WEIGHTS and i in (1, n - 1)
            saved = list(faults)
            if edge:
                faults.clear()
            assert pub.send(small(kind, i), topic=topic)
            faults[:] = saved
            if kind == P.WEIGHTS:
                sent_weights.append(i)

        def drain(ch: Channel) -> list[P.Message]:
            out = []
            while (got := ch.recv()) is not None:
                out.append(got[1])
            return out

        weights, metrics = drain(subs[P.WEIGHTS_TOPIC]), drain(subs[P.METRICS_TOPIC])
    finally:
        pub.close()
        for ch in subs.values():
            ch.close()
    # metrics: untouched, numbered 0.. on their own topic, no gaps.
    assert [m.seq for m in metrics] == list(range(n // 2))
    assert subs[P.METRICS_TOPIC].stats.gaps == 0
    # weights: numbered 0..n/2-1 on their own topic, about half lost, each loss one gap.
    seqs = [m.seq for m in weights]
    assert seqs[0] == 0 and seqs[-1] == len(sent_weights) - 1 and seqs == sorted(seqs)
    drops = len(sent_weights) - len(weights)
    assert abs(drops - p * (len(sent_weights) - 2)) < 5 * (len(sent_weights) * 0.25) ** 0.5
    assert subs[P.WEIGHTS_TOPIC].stats.gaps == drops > 0
    assert pub.stats.sent == n


def test_delay_rule_delays_only_its_kind(faults, pipe):
    faults.append(Fault(P.BATCH, "delay", 1.0, 0.2))
    t0 = time.monotonic()
    assert pipe.tx.send(small(P.TRAJECTORY, 0))
    fast = time.monotonic() - t0
    t0 = time.monotonic()
    assert pipe.tx.send(small(P.BATCH, 1))
    slow = time.monotonic() - t0
    assert slow >= 0.2
    assert fast < 0.1
    # Delayed, not lost: both arrive in order, no gaps.
    got = pipe.drain()
    assert [(m.kind, m.seq) for m in got] == [(P.TRAJECTORY, 0), (P.BATCH, 1)]
    assert pipe.rx.stats.gaps == 0


def test_delay_rule_probability(faults, pipe):
    """A delay with probability p delays about p of the sends; probability 0 never delays."""
    faults.append(Fault(P.BATCH, "delay", 0.0, 5.0))
    t0 = time.monotonic()
    for i in range(50):
        assert pipe.tx.send(small(P.BATCH, i))
    assert time.monotonic() - t0 < 1.0
    random.seed(3)
    faults[:] = [Fault(P.BATCH, "delay", 0.5, 0.05)]
    durations = []
    for i in range(50, 130):
        t0 = time.monotonic()
        assert pipe.tx.send(small(P.BATCH, i))
        durations.append(time.monotonic() - t0)
    random.seed(3)
    expected = [random.random() < 0.5 for _ in range(80)]
    # Every drawn delay happened; a send without one is fast (a busy machine may add a few).
    assert all(d >= 0.05 for d, e in zip(durations, expected, strict=True) if e)
    assert sum(d >= 0.05 for d in durations) <= sum(expected) + 3
    assert len(pipe.drain()) == 130
    assert pipe.rx.stats.gaps == 0


# Regression (found here, since fixed): sockets.py Channel.send: a ROUTER channel numbers its
# replies with one counter for all peers, so each reply to someone else (params answering a
# GET_WEIGHTS) is a sequence gap, i.e. a 'lost message', at the learner
def test_router_replies_to_other_peers_are_not_gaps(zmq_ctx):
    addr = f"inproc://zrl-test-faults-{next(_names)}"
    router_sock = make_socket(zmq_ctx, zmq.ROUTER, rcvtimeo_ms=1000)
    router_sock.bind(addr)
    router = Channel(router_sock, "rpc", "params-0", TransportStats(), envelope=True)
    peers = {}
    try:
        for name in ("learner-0", "actor-0"):
            s = make_socket(zmq_ctx, zmq.DEALER, rcvtimeo_ms=1000)
            s.connect(addr)
            peers[name] = Channel(s, "params-rpc", name, TransportStats())
        for name in ("learner-0", "actor-0", "learner-0"):
            assert peers[name].send(P.Message(P.GET_WEIGHTS))
            got = router.recv()
            assert got is not None and got[0] is not None
            assert router.send(P.Message(P.ACK, meta={"version": 1}), to=got[0])
            assert peers[name].recv() is not None
        # No reply to the learner was lost.
        assert peers["learner-0"].stats.received == 2
        assert peers["learner-0"].stats.gaps == 0
    finally:
        router.close()
        for ch in peers.values():
            ch.close()
