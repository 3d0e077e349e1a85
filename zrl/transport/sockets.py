"""Sockets with explicit options, and channels that count what they send and receive.

Every zrl socket is made by :func:`make_socket`, which sets the high-water marks,
``MAXMSGSIZE``, linger and timeouts explicitly (libzmq's defaults — unbounded
messages, infinite linger — are wrong for a long-running training job). A
:class:`Channel` wraps one socket with the protocol: it stamps sender and
sequence numbers on what it sends, validates what it receives, and keeps
per-stream counters (sent, received, dropped, sequence gaps) that every role
reports in its heartbeats.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from zrl.transport.protocol import (
    MAX_NAME_CHARS,
    Message,
    ProtocolError,
    decode,
    encode,
    peek_sender,
    saturate,
)
from zrl.transport.security import Keys, ensure_authenticator, secure_client, secure_server

log = logging.getLogger("zrl.transport")

DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
MAX_SKIPPED_PER_RECV = 1000  # malformed messages one recv() skips before yielding
# A sequence number this far past the sender's last one is no loss but a forgery (or
# corruption): counting it as a gap would let one message inflate the counters.
MAX_SEQ_JUMP = 2**32
# Senders whose sequence and drop counts one stream remembers; past it the oldest is
# forgotten, so a stream of invented sender ids cannot grow a role's memory.
MAX_TRACKED_SENDERS = 1024
DROP_LOG_INTERVAL_S = 10.0  # one drop warning per channel per interval, then a count
STAT_COUNTERS = ("sent", "received", "dropped", "gaps")
"""The counters of a stream's ``StreamStats.snapshot`` (what a heartbeat reports per stream)."""


def make_socket(
    ctx: zmq.Context,
    socket_type: int,
    *,
    sndhwm: int = 1000,
    rcvhwm: int = 1000,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    linger_ms: int = 0,
    rcvtimeo_ms: int = 1000,
    sndtimeo_ms: int = 1000,
    kernel_buffer_bytes: int | None = None,
    keys: Keys | None = None,
    server: bool = False,
) -> zmq.Socket:
    """A socket with every option that matters set explicitly.

    Timeouts are finite so no blocking call can hang a role forever; linger
    defaults to 0 because LINGER is no delivery guarantee anyway. With ``keys`` the
    socket speaks CURVE: as a ``server`` (it will bind; clients are checked against the
    allow-list) or as a client (it will connect)."""
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.RCVTIMEO, rcvtimeo_ms)
    sock.setsockopt(zmq.SNDTIMEO, sndtimeo_ms)
    if kernel_buffer_bytes is not None:
        # Linux autotunes loopback TCP buffers to megabytes, a hidden queue far deeper than
        # the HWM; bounding them keeps back-pressure (and data staleness) where we set it.
        sock.setsockopt(zmq.SNDBUF, kernel_buffer_bytes)
        sock.setsockopt(zmq.RCVBUF, kernel_buffer_bytes)
    if socket_type in (zmq.DEALER, zmq.ROUTER, zmq.REQ):
        # Reconnect quickly after a broker restart, but back off against a dead one.
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    if socket_type == zmq.ROUTER:
        # Replies to a peer that vanished are dropped instead of raising.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if keys is not None:
        if server:
            ensure_authenticator(ctx, keys)
            secure_server(sock, keys)
        else:
            secure_client(sock, keys)
    return sock


@dataclass
class StreamStats:
    """Counters of one stream (or socket) as seen by one role."""

    sent: int = 0
    received: int = 0
    dropped: int = 0
    gaps: int = 0
    dropped_by_sender: dict[str, int] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in STAT_COUNTERS}

    def note_seq(self, sender: str, seq: int) -> None:
        """Count missing sequence numbers; a reset (restarted sender) starts afresh.

        Raises ProtocolError for a jump past ``MAX_SEQ_JUMP`` (the caller drops the message)."""
        last = self.last_seq.pop(sender, None)
        if last is not None:
            if seq > last + MAX_SEQ_JUMP:
                self.last_seq[sender] = last
                raise ProtocolError(f"sequence number jumps from {last} to {seq}")
            if seq > last + 1:
                self.gaps = saturate(self.gaps + seq - last - 1)
        remember(self.last_seq, sender, seq)

    def note_drop(self, sender: str) -> None:
        self.dropped = saturate(self.dropped + 1)
        remember(self.dropped_by_sender, sender, self.dropped_by_sender.pop(sender, 0) + 1)


def remember(table: dict[str, int], key: str, value: int) -> None:
    """``table[key] = value`` as the newest entry, forgetting the oldest past
    ``MAX_TRACKED_SENDERS`` (dicts keep insertion order)."""
    table[key] = value
    while len(table) > MAX_TRACKED_SENDERS:
        del table[next(iter(table))]


class TransportStats:
    """All stream counters of one role, thread-safe enough for the in-process mode."""

    def __init__(self) -> None:
        self._streams: dict[str, StreamStats] = {}
        self._lock = threading.Lock()

    def stream(self, name: str) -> StreamStats:
        with self._lock:
            return self._streams.setdefault(name, StreamStats())

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {name: s.snapshot() for name, s in self._streams.items()}

    def totals(self) -> tuple[int, int, int]:
        snap = self.snapshot()
        return (
            sum(s["received"] for s in snap.values()),
            sum(s["sent"] for s in snap.values()),
            sum(s["dropped"] for s in snap.values()),
        )


FAULTS_ENV = "ZRL_TESTING_FAULTS"


@dataclass
class Fault:
    kind: str  # message kind it applies to, or "*"
    action: str  # "drop" or "delay"
    probability: float
    seconds: float = 0.0


def parse_faults(spec: str) -> list[Fault]:
    """``kind:drop:P`` and ``kind:delay:P:SECONDS`` rules, comma-separated (``*`` = any kind).

    Example: ``ZRL_TESTING_FAULTS="trajectory:drop:0.05,weights:delay:0.2:0.5"``."""
    faults = []
    for rule in filter(None, (r.strip() for r in spec.split(","))):
        parts = rule.split(":")
        try:
            if parts[1] == "drop" and len(parts) == 3:
                faults.append(Fault(parts[0], "drop", float(parts[2])))
            elif parts[1] == "delay" and len(parts) == 4:
                faults.append(Fault(parts[0], "delay", float(parts[2]), float(parts[3])))
            else:
                raise ValueError
        except (IndexError, ValueError):
            raise ValueError(
                f"{FAULTS_ENV}: bad rule {rule!r}; use kind:drop:P or kind:delay:P:SECONDS"
            ) from None
        if not 0.0 <= faults[-1].probability <= 1.0:
            raise ValueError(f"{FAULTS_ENV}: probability out of [0, 1] in {rule!r}")
        if not 0.0 <= faults[-1].seconds <= 3600.0:
            raise ValueError(f"{FAULTS_ENV}: delay out of [0, 3600] seconds in {rule!r}")
    return faults


_FAULTS: list[Fault] | None = None


def active_faults() -> list[Fault]:
    """The fault rules of this process (read once from the environment)."""
    global _FAULTS
    if _FAULTS is None:
        _FAULTS = parse_faults(os.environ.get(FAULTS_ENV, ""))
        if _FAULTS:
            log.warning("fault injection active: %s", os.environ[FAULTS_ENV])
    return _FAULTS


class Channel:
    """One socket speaking the zrl protocol.

    ``envelope`` is for ROUTER sockets (a routing-id frame precedes the message);
    ``topics`` for PUB/SUB sockets (a topic frame precedes it)."""

    def __init__(
        self,
        sock: zmq.Socket,
        name: str,
        sender: str,
        stats: TransportStats,
        *,
        envelope: bool = False,
        topics: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.sock = sock
        self.name = name
        self.sender = sender
        self.stats = stats.stream(name)
        self.envelope = envelope
        self.topics = topics
        self.max_message_bytes = max_message_bytes
        self._seq = 0
        self._topic_seq: dict[str | bytes, int] = {}
        self._next_drop_log = 0.0
        self._unlogged_drops = 0

    @property
    def next_seq(self) -> int:
        """Messages sent so far (the sequence number of the next one on a stream)."""
        return self._seq

    def send(
        self, msg: Message, *, to: bytes | None = None, topic: str | None = None, block: bool = True
    ) -> bool:
        """Send ``msg``; False when it could not be queued (timeout or full queue when not blocking)."""
        msg.sender = self.sender
        msg.stream = self.name
        # A topic channel numbers each topic on its own: a subscriber sees one topic only,
        # and must see consecutive numbers there for gaps to mean loss.
        topic_name = (topic or msg.kind) if self.topics else None
        # Number per topic (PUB) or per recipient (ROUTER): each receiver sees its own
        # consecutive numbers, so a gap there means a lost message.
        key: str | bytes | None = topic_name if self.topics else (to if self.envelope else None)
        msg.seq = self._topic_seq.get(key, 0) if key is not None else self._seq
        frames = encode(msg)
        if self.envelope:
            if to is None:
                raise ValueError("a ROUTER channel needs the recipient's routing id")
            frames = [to, *frames]
        if topic_name is not None:
            frames = [topic_name.encode(), *frames]
        for fault in active_faults():
            if fault.kind in ("*", msg.kind) and random.random() < fault.probability:
                if fault.action == "drop":
                    # Lost in transit: the sequence number is used up, so the receiver sees a gap.
                    self._advance(key, msg.seq)
                    self.stats.sent += 1
                    return True
                time.sleep(fault.seconds)
        try:
            self.sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self._advance(key, msg.seq)
        self.stats.sent = saturate(self.stats.sent + 1)
        return True

    def _advance(self, key: str | bytes | None, seq: int) -> None:
        self._seq += 1
        if key is not None:
            self._topic_seq[key] = seq + 1

    def recv(self, *, block: bool = True) -> tuple[bytes | None, Message] | None:
        """Receive one valid message: (routing id or None, message), or None when none came
        (within the socket's timeout if ``block``). Malformed messages are counted, dropped
        and skipped: a flood of garbage must not look like an empty queue to a drain loop."""
        for attempt in range(MAX_SKIPPED_PER_RECV):
            wait = block and attempt == 0
            # Asking EVENTS is far cheaper than a NOBLOCK recv that raises Again, and roles
            # poll their sockets this way in hot loops.
            if not wait and not int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN:
                return None
            try:
                frames = self.sock.recv_multipart(flags=0 if wait else zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            got = self._parse(frames)
            if got is not None:
                return got
        return None

    def _parse(self, frames: list[Any]) -> tuple[bytes | None, Message] | None:
        ident: bytes | None = None
        if self.envelope:
            if len(frames) < 2:
                self._drop("?", "no routing envelope")
                return None
            ident = frames[0].bytes
            frames = frames[1:]
        topic = ""
        if self.topics:
            if len(frames) < 2:
                self._drop("?", "no topic frame")
                return None
            topic = frames[0].bytes.decode("utf-8", "replace")
            frames = frames[1:]
        try:
            msg = decode(frames, max_bytes=self.max_message_bytes)
        except ProtocolError as exc:
            self._drop(peek_sender(frames), str(exc))
            return None
        # A publisher numbers each topic on its own: one subscriber receiving two topics from
        # the same sender (a shard's priorities and batch acks) tracks each sequence apart.
        try:
            self.stats.note_seq(
                f"{msg.sender} {topic[:MAX_NAME_CHARS]}" if topic else msg.sender, msg.seq
            )
        except ProtocolError as exc:
            self._drop(msg.sender, str(exc))
            return None
        self.stats.received = saturate(self.stats.received + 1)
        return ident, msg

    def _drop(self, sender: str, reason: str) -> None:
        """Count a dropped message; warn at most once per ``DROP_LOG_INTERVAL_S`` per channel,
        with how many went unlogged, so a flood cannot flood the log."""
        sender = sender[:MAX_NAME_CHARS]
        self.stats.note_drop(sender)
        now = time.monotonic()
        if now < self._next_drop_log:
            self._unlogged_drops += 1
            return
        self._next_drop_log = now + DROP_LOG_INTERVAL_S
        more = (
            f" ({self._unlogged_drops} more dropped since the last warning)"
            if self._unlogged_drops
            else ""
        )
        self._unlogged_drops = 0
        log.warning(
            "dropped malformed message on %s from %s: %s%s", self.name, sender, reason[:300], more
        )

    def close(self, linger_ms: int = 0) -> None:
        self.sock.close(linger=linger_ms)
