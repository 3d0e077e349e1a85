"""Socket options, Channel framing and counters, and the broker endpoint layout."""

from __future__ import annotations

import logging
import time

import msgpack
import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints, connect_address, is_loopback, split_tcp
from zrl.transport.sockets import (
    MAX_TRACKED_SENDERS,
    Channel,
    StreamStats,
    TransportStats,
    frames_nbytes,
    make_socket,
)

# --- make_socket -------------------------------------------------------------------------


SOCKET_TYPES = ["PUSH", "PULL", "DEALER", "ROUTER", "PUB", "SUB", "XPUB"]


@pytest.mark.parametrize("kind", [getattr(zmq, t) for t in SOCKET_TYPES], ids=SOCKET_TYPES)
def test_make_socket_sets_every_option(zmq_ctx, kind):
    sock = make_socket(
        zmq_ctx,
        kind,
        sndhwm=7,
        rcvhwm=11,
        max_message_bytes=123_456,
        linger_ms=13,
        rcvtimeo_ms=17,
        sndtimeo_ms=19,
        kernel_buffer_bytes=65_536,
    )
    try:
        got = {
            opt: sock.getsockopt(opt)
            for opt in (
                zmq.SNDHWM,
                zmq.RCVHWM,
                zmq.MAXMSGSIZE,
                zmq.LINGER,
                zmq.RCVTIMEO,
                zmq.SNDTIMEO,
                zmq.SNDBUF,
                zmq.RCVBUF,
            )
        }
        assert got == {
            zmq.SNDHWM: 7,
            zmq.RCVHWM: 11,
            zmq.MAXMSGSIZE: 123_456,
            zmq.LINGER: 13,
            zmq.RCVTIMEO: 17,
            zmq.SNDTIMEO: 19,
            zmq.SNDBUF: 65_536,
            zmq.RCVBUF: 65_536,
        }
        if kind in (zmq.DEALER, zmq.ROUTER):
            assert sock.getsockopt(zmq.RECONNECT_IVL) == 100
            assert sock.getsockopt(zmq.RECONNECT_IVL_MAX) == 2000
    finally:
        sock.close(linger=0)


def test_make_socket_defaults_are_finite(zmq_ctx):
    sock = make_socket(zmq_ctx, zmq.PULL)
    try:
        assert sock.getsockopt(zmq.LINGER) == 0
        assert sock.getsockopt(zmq.RCVTIMEO) == 1000
        assert sock.getsockopt(zmq.SNDTIMEO) == 1000
        assert sock.getsockopt(zmq.MAXMSGSIZE) == 256 * 2**20
        assert (sock.getsockopt(zmq.SNDHWM), sock.getsockopt(zmq.RCVHWM)) == (1000, 1000)
        # No kernel buffer size given: the OS default (-1) is left alone.
        assert (sock.getsockopt(zmq.SNDBUF), sock.getsockopt(zmq.RCVBUF)) == (-1, -1)
    finally:
        sock.close(linger=0)


# --- Channel ------------------------------------------------------------------------------

_counter = iter(range(10**9))


def inproc_name(tag: str) -> str:
    return f"inproc://zrl-sockets-{tag}-{next(_counter)}"


@pytest.fixture
def push_pull(zmq_ctx):
    """(sender Channel, receiver Channel, address) over inproc PUSH/PULL."""
    addr = inproc_name("pipe")
    pull = make_socket(zmq_ctx, zmq.PULL, rcvtimeo_ms=1000)
    pull.bind(addr)
    push = make_socket(zmq_ctx, zmq.PUSH, sndtimeo_ms=1000)
    push.connect(addr)
    tx = Channel(push, "experience", "actor-0", TransportStats())
    rx_stats = TransportStats()
    rx = Channel(pull, "experience", "replay-0", rx_stats)
    yield tx, rx, addr
    tx.close()
    rx.close()


def traj(i: int) -> P.Message:
    return P.Message(P.TRAJECTORY, meta={"i": i}, arrays={"obs": np.full((2, 3), i, np.float32)})


def test_channel_sequence_and_counters(push_pull):
    tx, rx, _ = push_pull
    for i in range(5):
        assert tx.next_seq == i
        assert tx.send(traj(i))
    assert tx.stats.snapshot() == {"sent": 5, "received": 0, "dropped": 0, "gaps": 0}
    for i in range(5):
        got = rx.recv()
        assert got is not None
        ident, msg = got
        assert ident is None
        assert (msg.seq, msg.sender, msg.stream, msg.meta["i"]) == (i, "actor-0", "experience", i)
        np.testing.assert_array_equal(msg.arrays["obs"], np.full((2, 3), i, np.float32))
    assert rx.recv(block=False) is None  # nothing left, and no drop counted for a timeout
    assert rx.stats.snapshot() == {"sent": 0, "received": 5, "dropped": 0, "gaps": 0}
    assert rx.stats.last_seq == {"actor-0": 4}


def test_channel_counts_the_bytes_it_sent(push_pull):
    """``sent_bytes``: every frame of each message sent (header and arrays), what a role
    reports of its experience path; the receiver's counts stay at 0."""
    tx, rx, _ = push_pull
    for i in range(3):
        assert tx.send(traj(i))
    received = [rx.recv() for _ in range(3)]
    sizes = [frames_nbytes(P.encode(got[1])) for got in received if got is not None]
    assert tx.stats.sent_bytes == sum(sizes) > 3 * 2 * 3 * 4  # the arrays and their headers
    assert rx.stats.sent_bytes == 0
    assert "sent_bytes" not in tx.stats.snapshot()  # heartbeats' stats keep their counters


def test_channel_send_false_when_queue_full(zmq_ctx):
    push = make_socket(zmq_ctx, zmq.PUSH, sndhwm=1, sndtimeo_ms=50)
    push.connect(inproc_name("nobody"))  # no peer ever binds: the pipe fills at once
    ch = Channel(push, "s", "me", TransportStats())
    try:
        results = [ch.send(traj(i), block=False) for i in range(5)]
        assert results[-1] is False
        assert ch.stats.sent == results.count(True)
        assert ch.next_seq == results.count(True)  # a failed send does not use up a seq
        assert ch.send(traj(9)) is False  # blocking send gives up after SNDTIMEO
    finally:
        ch.close()


def raw_header(sender: str, **fields) -> bytes:
    head = {"v": P.PROTOCOL_VERSION, "k": "x", "s": sender, "q": 0}
    head.update(fields)
    return msgpack.packb(head)


def test_malformed_counted_per_sender_and_logged_at_a_bounded_rate(push_pull, zmq_ctx, caplog):
    tx, rx, addr = push_pull
    raw = make_socket(zmq_ctx, zmq.PUSH)
    raw.connect(addr)
    bad = [
        [raw_header("evil", v=2)],  # wrong version
        [raw_header("evil", a=[["a", "|O", [1]]]), b"\0" * 8],  # object dtype
        [raw_header("evil", a=[["a", "<f4", [4]]]), b"\0" * 15],  # truncated array
        [raw_header("other", k="")],
        [b"\xc1 not msgpack"],
        [b""],
    ] * 3
    caplog.set_level(logging.WARNING, logger="zrl.transport")
    try:
        for frames in bad:
            raw.send_multipart(frames)
        assert tx.send(traj(0))
        # Two senders are fair-queued: the good one may overtake malformed ones, so read on
        # until the queue is empty (recv skips malformed messages).
        results = [rx.recv()]
        wait_for(lambda: rx.stats.dropped == len(bad) or results.append(rx.recv(block=False)))
        # The interval passes: the next drop is logged with the count of the silent ones.
        rx._next_drop_log = 0.0
        raw.send_multipart([raw_header("late", v=2)])
        assert rx.recv(block=True) is None
    finally:
        raw.close(linger=0)
    good = [r for r in results if r is not None]
    assert len(good) == 1 and good[0][1].sender == "actor-0"
    assert rx.stats.received == 1
    assert rx.stats.dropped == len(bad) + 1
    assert rx.stats.dropped_by_sender == {"evil": 9, "other": 3, "?": 6, "late": 1}
    warnings = [r.getMessage() for r in caplog.records if "dropped malformed" in r.getMessage()]
    assert len(warnings) == 2
    assert " from evil: " in warnings[0] and "on experience" in warnings[0]
    assert " from late: " in warnings[1] and f"({len(bad) - 1} more dropped" in warnings[1]


def test_sender_tables_are_bounded_and_long_ids_refused(push_pull, zmq_ctx):
    _, rx, addr = push_pull
    raw = make_socket(zmq_ctx, zmq.PUSH)
    raw.connect(addr)
    n = MAX_TRACKED_SENDERS + 50
    try:
        got = []
        for i in range(n):
            raw.send_multipart([raw_header(f"d{i}", v=9)])
            raw.send_multipart([raw_header(f"s{i}", q=i)])
            got.append(rx.recv())  # skips the malformed one, returns the good one
        raw.send_multipart([raw_header("x" * (P.MAX_NAME_CHARS + 1))])
        assert rx.recv() is None  # the long id is dropped
    finally:
        raw.close(linger=0)
    assert all(g is not None for g in got)
    assert len(rx.stats.last_seq) == MAX_TRACKED_SENDERS
    assert f"s{n - 1}" in rx.stats.last_seq and "s0" not in rx.stats.last_seq
    assert len(rx.stats.dropped_by_sender) == MAX_TRACKED_SENDERS
    assert rx.stats.dropped == n + 1


def test_sequence_jumps_are_dropped_and_counters_saturate(push_pull, zmq_ctx):
    _, rx, addr = push_pull
    raw = make_socket(zmq_ctx, zmq.PUSH)
    raw.connect(addr)
    try:
        # The attack: jumps to the top of the range would push the gap counter past 64 bits.
        for seq in (0, P.MAX_SEQ, P.MAX_SEQ, 1, 2**64 - 1, 2):
            raw.send_multipart([raw_header("evil", q=seq)])
        got = [rx.recv() for _ in range(3)]
        assert rx.recv() is None
    finally:
        raw.close(linger=0)
    assert [g[1].seq for g in got if g is not None] == [0, 1, 2]
    assert rx.stats.dropped == 3 and rx.stats.gaps == 0
    s = StreamStats(gaps=P.COUNTER_MAX - 1)
    s.note_seq("x", 0)
    s.note_seq("x", 2**31)
    assert s.gaps == P.COUNTER_MAX


def test_gaps_counted_through_channel(push_pull, zmq_ctx):
    _, rx, addr = push_pull
    raw = make_socket(zmq_ctx, zmq.PUSH)
    raw.connect(addr)
    try:
        # a: 0 1 4 5 (2 missing), b: 0 3 (2 missing), a restarts at 0 then 2 (1 missing).
        seqs = [("a", 0), ("a", 1), ("a", 4), ("b", 0), ("a", 5), ("b", 3), ("a", 0), ("a", 2)]
        for sender, seq in seqs:
            raw.send_multipart([raw_header(sender, q=seq)])
        for _ in range(8):
            assert rx.recv() is not None
    finally:
        raw.close(linger=0)
    assert rx.stats.gaps == 5
    # a's restarted sequence is followed beside its first until it passes it.
    assert rx.stats.last_seq == {"a": 5, "b": 3} and rx.stats.other_seq == {"a": 2}


def test_note_seq():
    s = StreamStats()
    s.note_seq("x", 0)
    s.note_seq("x", 1)
    assert s.gaps == 0
    s.note_seq("x", 5)
    assert s.gaps == 3
    s.note_seq("x", 5)  # a duplicate is no gap
    s.note_seq("x", 2)  # going back: a restarted sender, starts afresh
    assert s.gaps == 3
    s.note_seq("x", 3)
    assert s.gaps == 3
    s.note_seq("y", 10)  # first sight of a sender: no gap whatever the seq
    assert s.gaps == 3
    s.note_seq("y", 12)
    assert s.gaps == 4
    assert s.last_seq == {"x": 5, "y": 12} and s.other_seq == {"x": 3}
    s.note_seq("x", 6)  # the first sequence goes on: no gap, whatever the second did
    assert s.gaps == 4
    for seq in range(4, 8):  # the restarted one passes the first and replaces it
        s.note_seq("x", seq)
    assert s.gaps == 4 and s.last_seq["x"] == 7 and "x" not in s.other_seq


def test_transport_stats_totals():
    stats = TransportStats()
    stats.stream("a").sent = 2
    stats.stream("a").received = 3
    stats.stream("b").dropped = 4
    stats.stream("b").received = 1
    assert stats.stream("a") is stats.stream("a")
    assert stats.totals() == (4, 2, 4)
    assert stats.snapshot()["b"] == {"sent": 0, "received": 1, "dropped": 4, "gaps": 0}


def test_router_envelope(zmq_ctx):
    addr = inproc_name("router")
    router = make_socket(zmq_ctx, zmq.ROUTER)
    router.bind(addr)
    dealer = make_socket(zmq_ctx, zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"client-1")
    dealer.connect(addr)
    server = Channel(router, "rpc", "params-0", TransportStats(), envelope=True)
    client = Channel(dealer, "rpc", "learner-0", TransportStats())
    try:
        assert client.send(P.Message(P.GET_WEIGHTS))
        got = server.recv()
        assert got is not None
        ident, msg = got
        assert ident == b"client-1" and msg.kind == P.GET_WEIGHTS and msg.sender == "learner-0"
        with pytest.raises(ValueError, match="routing id"):
            server.send(P.Message(P.ACK))
        assert server.send(P.Message(P.ACK, meta={"version": 3}), to=ident)
        reply = client.recv()
        assert reply is not None
        assert reply[0] is None and reply[1].kind == P.ACK and reply[1].meta == {"version": 3}
        # A message with only a routing id and nothing else is dropped, not fatal.
        dealer.send(b"")
        assert server.recv() is None
        assert server.stats.dropped == 1
    finally:
        server.close()
        client.close()


def pub_sub_pair(
    zmq_ctx: zmq.Context, name: str, subscribe: bytes
) -> tuple[zmq.Socket, zmq.Socket]:
    """A bound PUB and a SUB (50 ms receive timeout) subscribed to ``subscribe`` on it."""
    addr = inproc_name(name)
    pub = make_socket(zmq_ctx, zmq.PUB)
    pub.bind(addr)
    sub = make_socket(zmq_ctx, zmq.SUB, rcvtimeo_ms=50)
    sub.setsockopt(zmq.SUBSCRIBE, subscribe)
    sub.connect(addr)
    return pub, sub


def test_pub_sub_topics(zmq_ctx):
    pub, sub = pub_sub_pair(zmq_ctx, "pubsub", b"weights")
    tx = Channel(pub, "topics", "params-0", TransportStats(), topics=True)
    rx = Channel(sub, "weights", "actor-0", TransportStats(), topics=True)
    try:
        # The subscription reaches the publisher asynchronously: probe until it has.
        deadline = time.monotonic() + 5
        while rx.recv() is None:
            assert time.monotonic() < deadline, "subscription never arrived"
            tx.send(P.Message(P.WEIGHTS, meta={"probe": True}))  # topic = kind = "weights"
        while rx.recv() is not None:
            pass
        tx.send(P.Message(P.METRICS, meta={"x": 1}))  # topic "metrics": filtered out
        tx.send(P.Message(P.METRICS, meta={"x": 2}), topic="weights/extra")
        got = rx.recv()
        assert got is not None and got[1].kind == P.METRICS and got[1].meta == {"x": 2}
        assert rx.recv() is None
        # A topic frame alone is dropped.
        pub.send(b"weights")
        assert rx.recv() is None
        assert rx.stats.dropped == 1 and rx.stats.dropped_by_sender == {"?": 1}
    finally:
        tx.close()
        rx.close()


def test_gaps_are_counted_per_topic_of_a_sender(zmq_ctx):
    """A publisher numbers each topic on its own (as a learner's priorities and batch acks to
    one shard): interleaved topics are no gap, a number missing within one topic is."""
    pub, sub = pub_sub_pair(zmq_ctx, "pubsub-gaps", b"")
    rx = Channel(sub, "shard", "replay-0", TransportStats(), topics=True)
    try:
        deadline = time.monotonic() + 5
        while rx.recv() is None:  # the subscription reaches the publisher asynchronously
            assert time.monotonic() < deadline, "subscription never arrived"
            pub.send_multipart([b"probe", raw_header("probe", q=0)])
        while rx.recv() is not None:
            pass
        # learner-0: topic a 0 1 2, topic b 0 1 3 (2 missing), interleaved.
        sent = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 3)]
        for topic, seq in sent:
            pub.send_multipart([topic.encode(), raw_header("learner-0", q=seq)])
        for _ in sent:
            assert rx.recv() is not None
        assert rx.stats.gaps == 1
    finally:
        rx.close()
        pub.close(linger=0)


def test_maxmsgsize_drops_oversized_message(zmq_ctx):
    """libzmq cuts a connection that carries a message above MAXMSGSIZE; the sender
    reconnects and the next normal message arrives."""
    pull = make_socket(zmq_ctx, zmq.PULL, max_message_bytes=10_000, rcvtimeo_ms=300)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = make_socket(zmq_ctx, zmq.PUSH, sndtimeo_ms=2000)
    push.setsockopt(zmq.RECONNECT_IVL, 50)
    monitor = push.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    monitor.setsockopt(zmq.RCVTIMEO, 5000)
    push.connect(f"tcp://127.0.0.1:{port}")
    tx = Channel(push, "s", "sender", TransportStats())
    rx = Channel(pull, "s", "receiver", TransportStats(), max_message_bytes=10_000)
    try:
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
        assert tx.send(P.Message("big", arrays={"a": np.ones(20_000, np.uint8)}))
        # Wait until the receiver has cut the connection, so the next message is not
        # lost in the same TCP stream.
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        assert tx.send(P.Message("small", arrays={"a": np.ones(100, np.uint8)}))
        got = None
        deadline = time.monotonic() + 5
        while got is None and time.monotonic() < deadline:
            got = rx.recv()
        assert got is not None
        assert got[1].kind == "small" and got[1].seq == 1
        assert rx.recv() is None  # the big one never shows up
        assert rx.stats.received == 1 and rx.stats.dropped == 0
        assert rx.stats.gaps == 0  # first message seen from this sender
    finally:
        push.disable_monitor()
        monitor.close(linger=0)
        tx.close()
        rx.close()


# --- endpoint layout -----------------------------------------------------------------------


def test_broker_endpoints_tcp():
    eps = broker_endpoints("tcp://10.0.0.1:5555", ["experience", "batches"])
    assert eps == {
        "registry": "tcp://10.0.0.1:5555",
        "topics_in": "tcp://10.0.0.1:5556",
        "topics_out": "tcp://10.0.0.1:5557",
        "experience_in": "tcp://10.0.0.1:5558",
        "experience_out": "tcp://10.0.0.1:5559",
        "batches_in": "tcp://10.0.0.1:5560",
        "batches_out": "tcp://10.0.0.1:5561",
        "topics_bulk_out": "tcp://10.0.0.1:5562",
    }
    assert broker_endpoints("tcp://[::1]:100", [])["topics_out"] == "tcp://[::1]:102"
    assert broker_endpoints("tcp://*:100", ["s"])["s_out"] == "tcp://*:104"


@pytest.mark.parametrize("base", ["inproc://zrl-x", "ipc:///tmp/zrl-x.sock"])
def test_broker_endpoints_named(base):
    eps = broker_endpoints(base, ("experience",))
    assert eps == {
        "registry": base,
        "topics_in": f"{base}-topics_in",
        "topics_out": f"{base}-topics_out",
        "experience_in": f"{base}-experience_in",
        "experience_out": f"{base}-experience_out",
        "topics_bulk_out": f"{base}-topics_bulk_out",
    }


def test_connect_address():
    assert connect_address("tcp://0.0.0.0:5558", "tcp://10.1.2.3:5555") == "tcp://10.1.2.3:5558"
    assert connect_address("tcp://*:5558", "tcp://host.lan:5555") == "tcp://host.lan:5558"
    assert connect_address("tcp://127.0.0.1:7", "tcp://[::1]:5555") == "tcp://[::1]:7"
    assert connect_address("inproc://b-topics_in", "inproc://b") == "inproc://b-topics_in"
    assert connect_address("ipc:///tmp/b-x", "tcp://10.0.0.1:1") == "ipc:///tmp/b-x"


@pytest.mark.parametrize(
    ("addr", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.1.2.3:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("inproc://x", True),
        ("ipc:///tmp/x", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.1:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://example.com:5555", False),
    ],
)
def test_is_loopback(addr, loopback):
    assert is_loopback(addr) is loopback


@pytest.mark.parametrize(
    "addr",
    [
        "udp://127.0.0.1:5555",
        "127.0.0.1:5555",
        "tcp://127.0.0.1",
        "tcp://:5555",
        "tcp://127.0.0.1:notaport",
        "tcp://127.0.0.1:70000",
        "",
    ],
)
def test_bad_addresses_raise_value_error(addr):
    with pytest.raises(ValueError):
        broker_endpoints(addr, ["s"])
    if addr.startswith("tcp://"):
        with pytest.raises(ValueError):
            split_tcp(addr)
        with pytest.raises(ValueError):
            is_loopback(addr)
        with pytest.raises(ValueError):
            connect_address(addr, "tcp://10.0.0.1:5555")


def test_split_tcp():
    assert split_tcp("tcp://10.0.0.1:5555") == ("10.0.0.1", 5555)
    assert split_tcp("tcp://[fe80::1]:80") == ("[fe80::1]", 80)
    with pytest.raises(ValueError, match="is not tcp://HOST:PORT"):
        split_tcp("ipc:///tmp/x")
