"""Waiting without sleeping: poll a condition, or probe the topic bus until a path is open.

PUB/SUB has no handshake: a subscription reaches the publishers some time after the SUB
subscribed (through the broker's XPUB/XSUB device, on another thread or host), and until then
the publisher drops what it sends on that topic ("slow joiner"). A fixed ``time.sleep`` either
wastes time or is too short on a loaded machine; these helpers wait exactly as long as needed,
and fail with a clear message after a timeout instead of hanging.

- :func:`wait_for`: poll a predicate until it is truthy.
- :func:`settle`: assert a predicate stays true for a while (nothing happens that should not).
- :func:`wait_subscribed`: the test owns the SUB: publish probe messages on the topic until the
  SUB receives one, then drain the probes. Proves the whole path publisher -> subscriber.
- :func:`wait_for_subscriber`: the subscriber is a role under test (the test cannot read its
  socket): the test publishes through an XPUB, which reports the subscriptions it learns;
  wait until one matches the topic. No message reaches the role.

A probe is a ``P.METRICS`` message from :data:`PROBE_SENDER` (meta ``{"probe": token, "n": i}``),
sent as raw frames so that no ``Channel`` counts or numbers it. A role subscribed to the same
topic receives probes like any message (and drops them, counted): probe only topics that no role
listens to, or use :func:`wait_for_subscriber`.
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import zmq

from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

PROBE_SENDER = "zrl-testing-probe"
DEFAULT_TIMEOUT_S = 10.0

# The subscriptions each XPUB reported so far (its messages can be read only once).
_known: weakref.WeakKeyDictionary[zmq.Socket, set[bytes]] = weakref.WeakKeyDictionary()


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    interval: float = 0.1,
    message: str | Callable[[], str] | None = None,
) -> object:
    """Poll until ``predicate()`` is truthy and return its value; AssertionError on timeout
    (with ``message`` if given; a callable one is asked then, to say what was seen last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    said = message() if callable(message) else message
    raise AssertionError(said or f"condition not met within {timeout}s: {predicate}")


def settle(pred: Callable[[], bool], seconds: float = 1.0) -> None:
    """Assert ``pred`` stays true for ``seconds`` (nothing happens that should not)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pred()
        time.sleep(0.05)


def _socket(end: Channel | zmq.Socket) -> zmq.Socket:
    return end.sock if isinstance(end, Channel) else end


def probe_frames(topic: str, token: str, n: int) -> list[Any]:
    """The frames of probe ``n`` of a wait identified by ``token`` (topic frame first)."""
    msg = P.Message(P.METRICS, meta={"probe": token, "n": n}, sender=PROBE_SENDER)
    msg.stream = "probe"
    msg.seq = n
    return [topic.encode(), *P.encode(msg)]


def probe_of(frames: list[Any]) -> tuple[str, int] | None:
    """(token, n) if ``frames`` (topic frame first) are a probe, else None."""
    if len(frames) < 2:
        return None
    try:
        msg = P.decode(frames[1:])
    except P.ProtocolError:
        return None
    token, n = msg.meta.get("probe"), msg.meta.get("n")
    if msg.sender != PROBE_SENDER or not isinstance(token, str) or not isinstance(n, int):
        return None
    return token, n


def wait_subscribed(
    pub: Channel | zmq.Socket,
    sub: Channel | zmq.Socket,
    topic: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.02,
    drain_quiet: float = 1.0,
) -> list[P.Message]:
    """Publish probes on ``topic`` through ``pub`` until ``sub`` (subscribed to the topic)
    receives one, then read the probes still in flight, so the next read of ``sub`` sees no
    probe. Returns the other messages ``sub`` received meanwhile (normally none: call it before
    anything is published on the topic); a ``Channel`` counts them as its ``recv`` would.

    When ``pub`` is a role's publisher the test cannot use, pass any other publisher connected
    to the same broker (``InProc.wait_subscribed`` does): the broker sends a subscription to
    every publisher at once. AssertionError after ``timeout`` seconds without a probe."""
    pub_sock, sub_sock = _socket(pub), _socket(sub)
    token = uuid.uuid4().hex
    others: list[P.Message] = []
    sent = 0
    first: int | None = None
    deadline = time.monotonic() + timeout
    next_send = 0.0
    while first is None:
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(
                f"no subscription to {topic!r} reached the publisher within {timeout:g}s "
                f"({sent} probes sent, none received)"
            )
        if now >= next_send:
            pub_sock.send_multipart(probe_frames(topic, token, sent), flags=zmq.NOBLOCK)
            sent += 1
            next_send = now + interval
        wait_ms = max(1, int(1000 * min(next_send, deadline) - 1000 * time.monotonic()))
        if sub_sock.poll(wait_ms):
            first = _read_probes(sub, token, others)
    # Probes first..sent-1 are queued behind the first one (one pipe, in order): read them all.
    last = first
    quiet_until = time.monotonic() + drain_quiet
    while last < sent - 1 and time.monotonic() < quiet_until:
        if sub_sock.poll(20):
            got = _read_probes(sub, token, others)
            if got is not None:
                last = max(last, got)
                quiet_until = time.monotonic() + drain_quiet
    return others


def _read_probes(sub: Channel | zmq.Socket, token: str, others: list[P.Message]) -> int | None:
    """Read everything queued at ``sub``: the highest probe number of this wait (None if no
    probe of it came), other probes discarded, other messages appended to ``others``."""
    sock = _socket(sub)
    highest: int | None = None
    while True:
        try:
            frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return highest
        probe = probe_of(frames)
        if probe is not None:
            if probe[0] == token:
                highest = probe[1] if highest is None else max(highest, probe[1])
            continue
        if isinstance(sub, Channel):
            got = sub.parse(frames)  # counted (received, dropped, gaps) as Channel.recv does
            if got is not None:
                others.append(got[1])
            continue
        try:
            others.append(P.decode(frames[1:]))
        except P.ProtocolError:
            pass


def wait_for_subscriber(
    pub: Channel | zmq.Socket, topic: str, *, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Wait until the XPUB ``pub`` knows a subscription that ``topic`` matches (a prefix of it),
    i.e. until what it publishes on ``topic`` is no longer dropped for want of a subscriber.

    Use it where the subscriber is a role under test: nothing is sent to it. An XPUB publishes
    like a PUB; it also reports each new subscription it learns (from the broker's XSUB, which
    passes on every subscriber's), which this reads and remembers per socket. Only new topics
    are reported: once one subscriber of a topic is known, a second one is not waited for (the
    broker forwards the topic to it anyway, once its own subscription reached the broker)."""
    sock = _socket(pub)
    if sock.type != zmq.XPUB:
        raise TypeError("wait_for_subscriber needs an XPUB publisher (a PUB hides subscriptions)")
    known = _known.setdefault(sock, set())
    wanted = topic.encode()
    deadline = time.monotonic() + timeout
    while not any(wanted.startswith(s) for s in known):
        left = deadline - time.monotonic()
        if left <= 0:
            shown = sorted(s.decode(errors="replace") for s in known)
            raise AssertionError(
                f"no subscriber to {topic!r} became known to the publisher within {timeout:g}s "
                f"(known subscriptions: {shown})"
            )
        if not sock.poll(max(1, int(min(left, 0.1) * 1000))):
            continue
        while True:
            try:
                frame = sock.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            if frame[:1] == b"\x01":
                known.add(frame[1:])
            elif frame[:1] == b"\x00":
                known.discard(frame[1:])
