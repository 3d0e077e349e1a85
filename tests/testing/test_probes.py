"""``zrl.testing.probes``: the waits that replace sleeps must neither hang nor leave probes behind.

Every socket lives on the test's own zmq context over ``inproc://`` with linger 0.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
import zmq

from zrl.testing.probes import (
    PROBE_SENDER,
    probe_frames,
    probe_of,
    wait_for,
    wait_for_subscriber,
    wait_subscribed,
)
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel, TransportStats, make_socket

_names = itertools.count()


@pytest.fixture
def addr() -> str:
    return f"inproc://zrl-test-probes-{next(_names)}"


@pytest.fixture
def pub(zmq_ctx, addr) -> Iterator[Channel]:
    sock = make_socket(zmq_ctx, zmq.XPUB)
    sock.bind(addr)
    ch = Channel(sock, "pub", "params-0", TransportStats(), topics=True)
    yield ch
    ch.close()


def subscriber(ctx: zmq.Context, addr: str, topic: str) -> Channel:
    sock = make_socket(ctx, zmq.SUB, rcvtimeo_ms=100)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sock.connect(addr)
    return Channel(sock, "sub", "test", TransportStats(), topics=True)


def test_probe_frames_round_trip():
    frames = probe_frames(P.WEIGHTS_TOPIC, "abc", 7)
    assert frames[0] == b"weights"
    assert probe_of(frames) == ("abc", 7)
    msg = P.decode(frames[1:])
    assert msg.kind == P.METRICS and msg.sender == PROBE_SENDER
    real = P.Message(P.WEIGHTS, meta={"probe": "abc", "n": 7}, sender="params-0")
    assert probe_of([b"weights", *P.encode(real)]) is None  # only the probe sender's
    assert probe_of([b"weights", b"\xc1 garbage"]) is None


def test_wait_subscribed_leaves_no_probe_and_counts_nothing(zmq_ctx, addr, pub):
    sub = subscriber(zmq_ctx, addr, P.WEIGHTS_TOPIC)
    try:
        assert wait_subscribed(pub, sub, P.WEIGHTS_TOPIC, interval=0.001) == []
        # Probes are raw frames: neither end's counters or sequence numbers moved.
        assert pub.stats.sent == 0 and pub.next_seq == 0
        assert sub.stats.snapshot() == {"sent": 0, "received": 0, "dropped": 0, "gaps": 0}
        assert pub.send(P.Message(P.WEIGHTS, meta={"version": 1}), topic=P.WEIGHTS_TOPIC)
        got = sub.recv()
        assert got is not None and got[1].kind == P.WEIGHTS and got[1].seq == 0
        assert sub.recv(block=False) is None
    finally:
        sub.close()


def test_wait_subscribed_returns_what_else_came(zmq_ctx, addr, pub):
    sub = subscriber(zmq_ctx, addr, P.WEIGHTS_TOPIC)
    try:
        wait_subscribed(pub, sub, P.WEIGHTS_TOPIC)
        assert pub.send(P.Message(P.WEIGHTS, meta={"version": 1}), topic=P.WEIGHTS_TOPIC)
        wait_for(lambda: sub.sock.poll(0), timeout=2)
        others = wait_subscribed(pub, sub, P.WEIGHTS_TOPIC)
        assert [m.meta["version"] for m in others] == [1]
        assert sub.stats.received == 1  # counted as Channel.recv would
        assert sub.recv(block=False) is None
    finally:
        sub.close()


def test_wait_subscribed_fails_instead_of_hanging(zmq_ctx, addr, pub):
    sub = subscriber(zmq_ctx, addr, P.METRICS_TOPIC)  # not the probed topic
    try:
        t0 = time.monotonic()
        with pytest.raises(AssertionError, match="no subscription to 'weights'"):
            wait_subscribed(pub, sub, P.WEIGHTS_TOPIC, timeout=0.3)
        assert time.monotonic() - t0 < 2
    finally:
        sub.close()


def test_wait_for_subscriber_sees_prefix_subscriptions(zmq_ctx, addr, pub):
    sub = subscriber(zmq_ctx, addr, P.priority_topic("replay-1"))
    try:
        wait_for_subscriber(pub, P.priority_topic("replay-1"))
        # Known now: returns at once, also for a topic that the prefix matches.
        wait_for_subscriber(pub, P.priority_topic("replay-1") + "extra", timeout=0.01)
        # The trailing slash keeps replay-10 out.
        with pytest.raises(AssertionError, match="no subscriber to 'priorities/replay-10/'"):
            wait_for_subscriber(pub, P.priority_topic("replay-10"), timeout=0.2)
    finally:
        sub.close()


def test_wait_for_subscriber_needs_an_xpub(zmq_ctx, addr):
    sock = make_socket(zmq_ctx, zmq.PUB)
    try:
        with pytest.raises(TypeError, match="XPUB"):
            wait_for_subscriber(sock, P.WEIGHTS_TOPIC)
    finally:
        sock.close(linger=0)


def test_wait_for_times_out_with_its_message():
    with pytest.raises(AssertionError, match="never true"):
        wait_for(lambda: False, timeout=0.05, interval=0.01, message="never true")
    assert wait_for(lambda: 3, timeout=1) == 3
