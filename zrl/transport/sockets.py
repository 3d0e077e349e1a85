"""Sockets with explicit options, and channels that count what they send and receive.

Every zrl socket is made by :func:`make_socket`, which sets the high-water marks,
``MAXMSGSIZE``, linger and timeouts explicitly (libzmq's defaults — unbounded
messages, infinite linger — are wrong for a long-running training job). A
:class:`Channel` wraps one socket with the protocol: it stamps sender and
sequence numbers on what it sends, validates what it receives, and keeps
per-stream counters (sent, received, dropped, sequence gaps) that every role
reports in its heartbeats. Sequence gaps follow expected peers only: the connection on a
ROUTER, the run's planned roles elsewhere (``Channel.expected_peers``), never an id a message
names for itself. :class:`ReplyBudget` bounds the bytes a ROUTER queues for peers that do
not read its replies.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import OrderedDict, deque
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
    sent_bytes: int = 0
    """Bytes of the messages sent (their frames, without a routing id or topic frame): what
    a role reports of its experience paths (``wire_bytes_<stream>``), not in heartbeats'
    ``stats``."""
    dropped_by_sender: dict[str, int] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)
    other_seq: dict[str, int] = field(default_factory=dict)
    """A second sequence per sender, below ``last_seq``'s: a restarted sender's new one (or a
    forger's), followed apart so that a forged low number cannot reset the real sequence."""

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in STAT_COUNTERS}

    def note_seq(self, sender: str, seq: int) -> None:
        """Count missing sequence numbers. A number at or below what ``sender`` sent so far
        (a restart, or a forgery) starts a second sequence beside the first: each number
        continues the nearest sequence below it, so neither a restart nor a forged low number
        counts gaps in the other. When the second passes the first it replaces it.

        Raises ProtocolError for a jump past ``MAX_SEQ_JUMP`` (the caller drops the message)."""
        high = self.last_seq.pop(sender, None)
        low = self.other_seq.pop(sender, None)
        if high is None:
            remember(self.last_seq, sender, seq)
            return
        below = [t for t in (high, low) if t is not None and t < seq]
        if not below:
            remember(self.last_seq, sender, high)
            remember(self.other_seq, sender, seq)
            return
        nearest = max(below)
        if seq > nearest + MAX_SEQ_JUMP:
            remember(self.last_seq, sender, high)
            if low is not None:
                remember(self.other_seq, sender, low)
            raise ProtocolError(f"sequence number jumps from {nearest} to {seq}")
        if seq > nearest + 1:
            self.gaps = saturate(self.gaps + seq - nearest - 1)
        if nearest == high:
            high = seq
        else:
            low = seq
        if low is not None and low >= high:
            high, low = low, None
        remember(self.last_seq, sender, high)
        if low is not None:
            remember(self.other_seq, sender, low)

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


class ReplyBudget:
    """A byte bound on what a ROUTER has queued for its peers: at most ``per_peer_bytes`` for
    one peer and ``total_bytes`` for all of them together.

    libzmq bounds a ROUTER's queue to each peer in messages (SNDHWM), not bytes, and gives
    no way to see how much of it a peer has read. So the budget counts every reply sent to a
    peer as queued for ``drain_s`` seconds (a peer that reads has read it by then), each at
    least ``MIN_REPLY_CHARGE`` bytes (which bounds the budget's own table). A reply that
    would take its peer or the total past its bound is not sent: :meth:`admit` returns False
    and the caller counts it dropped (``dropped``, ``dropped_bytes``). So a peer that never
    reads holds at most ``per_peer_bytes`` and peers together at most ``total_bytes`` per
    ``drain_s`` (and, after that, at most the socket's SNDHWM replies each). Used by the
    broker's registry (STATUS listings, LOOKUP replies) and by any rpc server that answers
    with large messages (``Channel.send(..., budget=)``)."""

    MIN_REPLY_CHARGE = 1024

    def __init__(self, *, per_peer_bytes: int, total_bytes: int, drain_s: float = 10.0) -> None:
        if not 0 < per_peer_bytes <= total_bytes or drain_s <= 0:
            raise ValueError(
                f"reply budget needs 0 < per_peer_bytes ({per_peer_bytes}) <= total_bytes "
                f"({total_bytes}) and drain_s ({drain_s}) > 0"
            )
        self.per_peer_bytes = per_peer_bytes
        self.total_bytes = total_bytes
        self.drain_s = drain_s
        self._sent: OrderedDict[bytes, deque[tuple[float, int]]] = OrderedDict()
        """Peer -> (time, bytes) of its replies of the last ``drain_s``, least recently sent
        to first."""
        self.queued = 0
        """Bytes counted as queued now, over every peer (at most ``total_bytes``)."""
        self.dropped = 0
        self.dropped_bytes = 0

    def _trim(self, sends: deque[tuple[float, int]], now: float) -> None:
        while sends and now - sends[0][0] >= self.drain_s:
            self.queued -= sends.popleft()[1]

    def _expire(self, now: float) -> None:
        # Peers in order of their last reply: once one's last reply is recent, so is every
        # later peer's (their older replies are trimmed when they are next asked about).
        while self._sent:
            peer, sends = next(iter(self._sent.items()))
            self._trim(sends, now)
            if sends:
                break
            del self._sent[peer]

    def queued_for(self, peer: bytes, now: float | None = None) -> int:
        """Bytes counted as queued for ``peer``."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        sends = self._sent.get(peer)
        if sends is not None:
            self._trim(sends, now)
        return sum(n for _, n in sends) if sends else 0

    def admit(self, peer: bytes, nbytes: int, now: float | None = None) -> bool:
        """Whether a reply of ``nbytes`` to ``peer`` fits; if so it is counted as queued."""
        now = time.monotonic() if now is None else now
        charge = max(nbytes, self.MIN_REPLY_CHARGE)
        held = self.queued_for(peer, now)
        if held + charge > self.per_peer_bytes or self.queued + charge > self.total_bytes:
            self.dropped = saturate(self.dropped + 1)
            self.dropped_bytes = saturate(self.dropped_bytes + nbytes)
            return False
        sends = self._sent.get(peer)
        if sends is None:
            sends = self._sent[peer] = deque()
        else:
            self._sent.move_to_end(peer)
        sends.append((now, charge))
        self.queued += charge
        return True


def frames_nbytes(frames: list[Any]) -> int:
    """The bytes of a message's frames (bytes, buffers or numpy arrays)."""
    return sum(f.nbytes if hasattr(f, "nbytes") else len(f) for f in frames)


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
        self.expected_peers: frozenset[str] | None = None
        """Sender ids whose sequences (``gaps``) this channel follows; None: every one. On a
        ROUTER the sequence follows the connection (routing id) instead, whatever id a
        message names."""
        self._seq = 0
        self._topic_seq: dict[str | bytes, int] = {}
        self._next_drop_log = 0.0
        self._unlogged_drops = 0

    @property
    def next_seq(self) -> int:
        """Messages sent so far (the sequence number of the next one on a stream)."""
        return self._seq

    def reply(self, msg: Message, to: bytes, budget: ReplyBudget | None = None) -> bool:
        """Queue a reply to the peer ``to`` of this ROUTER without blocking; False (counted in
        ``dropped``, and in ``budget`` when past it) when its queue is full, past ``budget``
        or the peer left (with ``ROUTER_MANDATORY``)."""
        try:
            return self.send(msg, to=to, block=False, budget=budget)
        except zmq.ZMQError:  # EHOSTUNREACH: the peer is gone
            return False

    def send(
        self,
        msg: Message,
        *,
        to: bytes | None = None,
        topic: str | None = None,
        block: bool = True,
        budget: ReplyBudget | None = None,
    ) -> bool:
        """Send ``msg``; False when it could not be queued (timeout or full queue when not
        blocking, or a reply to ``to`` past ``budget``: counted there and in ``dropped``)."""
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
        nbytes = frames_nbytes(frames)
        if self.envelope:
            if to is None:
                raise ValueError("a ROUTER channel needs the recipient's routing id")
            if budget is not None and not budget.admit(to, nbytes):
                self.stats.dropped = saturate(self.stats.dropped + 1)
                return False
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
        self.stats.sent_bytes = saturate(self.stats.sent_bytes + nbytes)
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
            got = self.parse(frames)
            if got is not None:
                return got
        return None

    def parse(self, frames: list[Any]) -> tuple[bytes | None, Message] | None:
        """Frames received on this channel's socket as ``(routing id, message)``, counted
        (received, dropped, gaps) as :meth:`recv` counts them; None for a dropped message."""
        ident: bytes | None = None
        if self.envelope:
            if len(frames) < 2:
                self.drop("?", "no routing envelope")
                return None
            ident = frames[0].bytes
            frames = frames[1:]
        topic = ""
        if self.topics:
            if len(frames) < 2:
                self.drop("?", "no topic frame")
                return None
            topic = frames[0].bytes.decode("utf-8", "replace")
            frames = frames[1:]
        try:
            msg = decode(frames, max_bytes=self.max_message_bytes)
        except ProtocolError as exc:
            self.drop(peek_sender(frames), str(exc))
            return None
        # A publisher numbers each topic on its own: one subscriber receiving two topics from
        # the same sender (a shard's priorities and batch acks) tracks each sequence apart.
        # The sender id is the message's word: sequences follow the connection where there
        # is one (ROUTER), else expected peers only, so invented ids move no counter.
        key: str | None
        if ident is not None:
            key = "@" + ident.hex()[: 2 * MAX_NAME_CHARS]
        elif self.expected_peers is not None and msg.sender not in self.expected_peers:
            key = None
        else:
            key = f"{msg.sender} {topic[:MAX_NAME_CHARS]}" if topic else msg.sender
        if key is not None:
            try:
                self.stats.note_seq(key, msg.seq)
            except ProtocolError as exc:
                self.drop(msg.sender, str(exc))
                return None
        self.stats.received = saturate(self.stats.received + 1)
        return ident, msg

    def drop(self, sender: str, reason: str) -> None:
        """Drop a malformed or refused message from ``sender``: count it in ``stats`` and warn
        at most once per ``DROP_LOG_INTERVAL_S`` per channel, with how many went unlogged, so a
        flood cannot flood the log. Roles call it for messages they refuse after decoding."""
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
