"""The broker: the one well-known address of a zrl experiment.

Sockets (base address tcp://H:P; see ``broker_endpoints`` for the full layout):

- ROUTER ``registry`` (P): roles say HELLO and get WELCOME (their id, the experiment
  spec, the stream endpoints, the message size limits) or REFUSED (with a reason), then
  HEARTBEAT (answered with HEARTBEAT_ACK, or UNKNOWN_ROLE) and BYE; anyone may ask
  LOOKUP (a service's rpc endpoints) and STATUS (the role table).
- XSUB ``topics_in`` (P+1) / XPUB ``topics_out`` (P+2) and XPUB ``topics_bulk_out`` (after
  the streams): the topic bus (weights, metrics, eval, priorities/<shard>, ...) in two
  lanes. Messages up to ``broker.small_topic_message_bytes`` go out on ``topics_out``,
  queued up to ``broker.topic_hwm`` per subscriber; bigger ones (weights, rollouts) on
  ``topics_bulk_out``, queued up to ``broker.bulk_topic_hwm``. Subscribers connect to both.
  PUB semantics: a slow subscriber loses messages at its high-water mark, never blocks
  the publisher.
- per stream S: PULL ``S_in`` / PUSH ``S_out``: load-balanced pipelines (experience,
  batches, ...). PUSH semantics: a full queue blocks the producer (back-pressure).

The stream devices are ``zmq.proxy_steerable`` running in C in their own threads; no
stream byte passes through Python here. The topic bus is forwarded by a Python thread
that passes frames by reference (never copies them) and drops any message of more
frames or bytes than a zrl message may have: libzmq bounds frames, not messages, so
only that, and the two lanes, keep a stuck subscriber's queue under ``topic_hwm`` x
``small_topic_message_bytes`` + ``bulk_topic_hwm`` x ``max_topic_message_bytes``: one lane
with a single HWM either drops bursts of small messages or queues gigabytes of large ones. The registry validates every message it reads (malformed
ones are counted and dropped) and bounds what it stores: ``max_roles`` entries, ids
and addresses of ``MAX_ID_CHARS``/``MAX_FIELD_CHARS``, ``max_info_bytes`` of heartbeat
info; dead and stopped entries are forgotten after ``forget_after`` seconds. An entry
belongs to the connection (ROUTER routing id) that registered it: HELLO, HEARTBEAT and
BYE for a live id from another connection are dropped and counted.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from zrl import __version__
from zrl.config import DEFAULT_STREAMS, ExperimentConfig
from zrl.factories import Factories
from zrl.transport import protocol as P
from zrl.transport.security import Keys, stop_authenticator
from zrl.transport.sockets import Channel, TransportStats, broker_endpoints, make_socket

log = logging.getLogger("zrl.broker")

REGISTRY_POLL_MS = 100
LIVENESS_CHECK_S = 0.25
# Registry messages are small (the largest, a heartbeat, is its info plus counters); the
# big reply, WELCOME with pickled factories, goes out, which MAXMSGSIZE does not limit.
REGISTRY_MAX_MESSAGE_BYTES = 2**20
# Per connection: a peer that asks and never reads holds at most this many replies.
REGISTRY_SNDHWM = 16
REGISTRY_RCVHWM = 64
MAX_ID_CHARS = 128  # role names, role ids, stream names
MAX_FIELD_CHARS = 256  # host, rpc endpoint, advertised address
MAX_STREAMS_PER_ROLE = 32
MAX_INFO_ITEMS = 256  # keys + values in a heartbeat's info, nested ones included
MAX_PID = 2**32
COUNTER_MAX = 2**63 - 1  # sums stay encodable (msgpack stops at 2**64 - 1)
DROP_LOG_INTERVAL_S = 10.0
MAX_LOG_KEYS = 4096
MAX_DEAD_LOGGED = 10  # per liveness pass; 2,000 fake HELLOs going dead at once are one summary
FORWARD_BATCH = 256  # messages one direction of the topic bus moves before the other's turn
# topic frame + header frame + one frame per array: a message with more is not zrl's.
MAX_TOPIC_FRAMES = P.MAX_ARRAYS + 2


STAT_COUNTERS = ("sent", "received", "dropped", "gaps")


def valid_name(value: Any, limit: int = MAX_ID_CHARS) -> bool:
    """A non-empty printable string of at most ``limit`` characters (no log injection)."""
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def valid_text(value: Any, limit: int = MAX_FIELD_CHARS) -> bool:
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def for_log(value: Any, limit: int = 64) -> str:
    """A peer-chosen value as a short, printable log token."""
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"
    text = ascii(value[:limit])[1:-1]
    return text if len(value) <= limit else f"{text}...({len(value)} chars)"


def info_fits(info: dict[str, Any], max_bytes: int) -> bool:
    """Whether a heartbeat's info is small enough to keep: bytes bound the strings in it,
    the item count bounds the Python objects (16 KiB of tiny items is ~100x that in RAM)."""
    items = 0
    stack: list[Any] = [info]
    while stack:
        obj = stack.pop()
        items += 1
        if items > MAX_INFO_ITEMS:
            return False
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    try:
        return len(msgpack.packb(info, use_bin_type=True)) <= max_bytes
    except (TypeError, ValueError, OverflowError):
        return False


def clean_stats(raw: Any, previous: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """A role's reported stream counters, keeping only well-formed ones (a peer may lie):
    at most ``MAX_STREAMS_PER_ROLE`` streams, counters in [0, COUNTER_MAX]."""
    if not isinstance(raw, dict):
        return previous
    clean: dict[str, dict[str, int]] = {}
    for stream, counters in raw.items():
        if len(clean) >= MAX_STREAMS_PER_ROLE:
            break
        if valid_name(stream) and isinstance(counters, dict):
            clean[stream] = {
                k: min(v, COUNTER_MAX)
                for k in STAT_COUNTERS
                if isinstance(v := counters.get(k, 0), int) and not isinstance(v, bool) and v >= 0
            }
    return clean


@dataclass
class RoleEntry:
    """What the registry knows about one registered role."""

    id: str
    role: str
    host: str
    pid: int
    rpc: str
    routing_id: bytes
    address: str = ""
    state: str = "starting"  # starting | alive | dead | stopped
    registered: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    restarts: int = 0
    ended: float = 0.0  # monotonic time it went dead or stopped: forgotten forget_after later
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def row(self, now: float) -> dict[str, Any]:
        def total(key: str) -> int:
            return min(sum(s.get(key, 0) for s in self.stats.values()), COUNTER_MAX)

        received, sent, dropped, gaps = (total(k) for k in ("received", "sent", "dropped", "gaps"))
        return {
            "id": self.id,
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "address": self.address,
            "rpc": self.rpc,
            "state": self.state,
            "age": round(now - self.last_seen, 2),
            "restarts": self.restarts,
            "msgs_in": received,
            "msgs_out": sent,
            "dropped": dropped,
            "gaps": gaps,
            "streams": self.stats,
            "info": self.info,
        }


class Broker:
    """Registry plus routing devices. ``run()`` serves until ``stop()`` is called."""

    def __init__(
        self,
        bind: str,
        config: ExperimentConfig | None = None,
        *,
        ctx: zmq.Context | None = None,
        keys: Keys | None = None,
        factories: Factories | None = None,
    ) -> None:
        self.config = config
        self.keys = keys
        self.factories = factories or Factories()
        if self.factories.needs_pickle() and keys is None and not bind.startswith("inproc://"):
            raise ValueError(
                "this experiment's env/model factories are Python callables, which the broker "
                "ships as pickles: that needs --keys (authenticated sockets), or factories given "
                "as 'package.module:name' references"
            )
        self._pickled = (
            np.frombuffer(self.factories.pickled(), dtype=np.uint8)
            if self.factories.needs_pickle()
            else None
        )
        bcfg = config.broker if config is not None else ExperimentConfig().broker
        self.streams = list(bcfg.streams) if config is not None else list(DEFAULT_STREAMS)
        self.heartbeat_interval = bcfg.heartbeat_interval
        self.heartbeat_timeout = bcfg.heartbeat_timeout
        self.setup_grace = bcfg.setup_grace
        self.max_message_bytes = bcfg.max_message_bytes
        self.stream_hwm = bcfg.stream_hwm
        self.stream_buffer_bytes = bcfg.stream_buffer_bytes
        self.max_topic_message_bytes = min(bcfg.max_topic_message_bytes, bcfg.max_message_bytes)
        self.topic_hwm = bcfg.topic_hwm
        self.bulk_topic_hwm = bcfg.bulk_topic_hwm
        self.small_topic_message_bytes = min(
            bcfg.small_topic_message_bytes, self.max_topic_message_bytes
        )
        self.topic_buffer_bytes = bcfg.topic_buffer_bytes
        self.max_roles = bcfg.max_roles
        self.max_info_bytes = bcfg.max_info_bytes
        self.forget_after = bcfg.forget_after
        self.bind_address = bind
        self.endpoints = broker_endpoints(bind, self.streams)
        # An own context lets close() end devices blocked on a full queue (ctx.term() wakes
        # them with ETERM); in-process mode shares the caller's context for inproc://.
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stats = TransportStats()
        self.roles: dict[str, RoleEntry] = {}
        self._counters: dict[str, int] = {}
        self.rejected: dict[str, int] = {}  # registry messages refused or dropped, by reason
        self.topic_dropped = 0  # topic bus messages over the frame or byte limit
        self._logged: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._controls: list[zmq.Socket] = []
        self.started = time.time()
        self.id = f"broker@{socket.gethostname()}"

        registry_max = min(self.max_message_bytes, REGISTRY_MAX_MESSAGE_BYTES)
        registry = make_socket(self.ctx, zmq.ROUTER, sndhwm=REGISTRY_SNDHWM,
                               rcvhwm=REGISTRY_RCVHWM, max_message_bytes=registry_max, keys=keys,
                               server=True)  # fmt: skip
        self._bind(registry, "registry")
        self.registry = Channel(
            registry, "registry", self.id, self.stats, envelope=True,
            max_message_bytes=registry_max,
        )  # fmt: skip
        # Topic bus. HWMs count messages, so bytes are bounded only with a message size
        # bound too: a stuck subscriber's pipe holds at most topic_hwm messages of at most
        # max_topic_message_bytes (the forwarder enforces that per message; MAXMSGSIZE is
        # per frame) plus its kernel buffer. A busy but reading subscriber queues on its own
        # side (its SUB's RCVHWM), so a small HWM here costs no legitimate message.
        xsub = self._device_socket(zmq.XSUB, self.topic_hwm, self.topic_buffer_bytes,
                                   max_message_bytes=self.max_topic_message_bytes)  # fmt: skip
        xpub = self._device_socket(zmq.XPUB, self.topic_hwm, self.topic_buffer_bytes,
                                   max_message_bytes=self.max_topic_message_bytes)  # fmt: skip
        bulk = self._device_socket(zmq.XPUB, self.bulk_topic_hwm, self.topic_buffer_bytes,
                                   max_message_bytes=self.max_topic_message_bytes)  # fmt: skip
        for out in (xpub, bulk):
            # NODROP would make a stuck subscriber block the bus instead of losing its share.
            out.setsockopt(zmq.XPUB_NODROP, 0)
        self._bind(xsub, "topics_in")
        self._bind(xpub, "topics_out")
        self._bind(bulk, "topics_bulk_out")
        self._topics_bulk = bulk
        self._start_device("topics", xsub, xpub, loop=self._forward_topics)
        for name in self.streams:
            pull = self._device_socket(zmq.PULL, self.stream_hwm, self.stream_buffer_bytes)
            push = self._device_socket(zmq.PUSH, self.stream_hwm, self.stream_buffer_bytes)
            self._bind(pull, f"{name}_in")
            self._bind(push, f"{name}_out")
            self._start_device(name, pull, push)

    def _device_socket(
        self, kind: int, hwm: int, kernel_buffer: int | None = None, *,
        max_message_bytes: int | None = None,
    ) -> zmq.Socket:  # fmt: skip
        # No timeouts: zmq_proxy gives up for good on the first EAGAIN, losing the message in
        # flight and the whole device. A full PUSH side must block (back-pressure) instead.
        return make_socket(self.ctx, kind, sndhwm=hwm, rcvhwm=hwm, rcvtimeo_ms=-1, sndtimeo_ms=-1,
                           max_message_bytes=max_message_bytes or self.max_message_bytes,
                           kernel_buffer_bytes=kernel_buffer, keys=self.keys, server=True)  # fmt: skip

    def _bind(self, sock: zmq.Socket, name: str) -> None:
        addr = self.endpoints[name]
        try:
            sock.bind(addr)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._close_devices()
            raise OSError(f"broker cannot bind {name} at {addr}: {exc}") from None

    def _start_device(
        self, name: str, frontend: zmq.Socket, backend: zmq.Socket,
        loop: Any = None,
    ) -> None:  # fmt: skip
        ctrl_addr = f"inproc://zrl-broker-ctrl-{id(self)}-{name}"
        ctrl_server = make_socket(self.ctx, zmq.PAIR, rcvtimeo_ms=-1)
        ctrl_server.bind(ctrl_addr)
        ctrl_client = make_socket(self.ctx, zmq.PAIR)
        ctrl_client.connect(ctrl_addr)
        self._controls.append(ctrl_client)

        def device() -> None:
            try:
                if loop is not None:
                    loop(frontend, backend, ctrl_server)
                    return
                while True:
                    try:
                        zmq.proxy_steerable(frontend, backend, None, ctrl_server)
                        return  # TERMINATE
                    except zmq.Again:
                        # With CURVE, a connection's first message can make a socket report
                        # readable before a part is there; zmq_proxy gives up on that EAGAIN
                        # before forwarding anything, so going back into the proxy loses nothing.
                        continue
            except zmq.ContextTerminated:
                pass
            finally:
                for s in (frontend, backend, ctrl_server):
                    s.close(linger=0)

        t = threading.Thread(target=device, name=f"zrl-device-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _forward_topics(self, xsub: zmq.Socket, xpub: zmq.Socket, ctrl: zmq.Socket) -> None:
        """The topic bus: messages down (XSUB -> the small or the bulk XPUB by size, checked),
        subscriptions up from both (as they are), until TERMINATE arrives on ``ctrl``. Frames
        move by reference, never copied."""
        bulk = self._topics_bulk
        poller = zmq.Poller()
        for sock in (xsub, xpub, bulk, ctrl):
            poller.register(sock, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if ctrl in ready:
                    return
                for out in (xpub, bulk):
                    if out in ready:
                        self._move(out, xsub, xsub)
                if xsub in ready:
                    self._move(xsub, xpub, bulk, check=True)
        finally:
            bulk.close(linger=0)

    def _move(
        self, src: zmq.Socket, small: zmq.Socket, bulk: zmq.Socket, *, check: bool = False
    ) -> None:
        for _ in range(FORWARD_BATCH):
            try:
                frames = src.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            size = sum(len(f) for f in frames)
            dst = small if size <= self.small_topic_message_bytes else bulk
            if check and (len(frames) > MAX_TOPIC_FRAMES or size > self.max_topic_message_bytes):
                self.topic_dropped += 1
                topic = frames[0].bytes[:64].decode("utf-8", "replace")
                self._note_drop(topic, "topic message too large", (
                    f"{len(frames)} frames, {sum(len(f) for f in frames)} bytes (at most "
                    f"{MAX_TOPIC_FRAMES} frames and {self.max_topic_message_bytes} bytes)"
                ))  # fmt: skip
                continue
            try:
                dst.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # XPUB drops at a full pipe itself; XSUB never blocks on subscriptions

    def _note_drop(self, sender: Any, reason: str, detail: str) -> None:
        """Log a dropped message at most once per sender and reason per DROP_LOG_INTERVAL_S,
        with the count since the last line: a flood must not flood the log."""
        key = (for_log(sender), reason)
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(key, -math.inf) < DROP_LOG_INTERVAL_S:
            return
        if len(self._logged) >= MAX_LOG_KEYS:
            self._logged.clear()
        self._logged[key] = now
        log.warning("%s from %s: %s (%d so far)", reason, key[0], detail, self.rejected[reason])

    def _reject(self, sender: Any, reason: str, detail: str) -> None:
        """A registry message refused or dropped by the registry's rules: counted as dropped."""
        self.registry.stats.dropped += 1
        self._note_drop(sender, reason, detail)

    def _close_devices(self) -> None:
        for ctrl in self._controls:
            try:
                ctrl.send(b"TERMINATE", flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        # A device blocked on a full PUSH side never reads TERMINATE; with our own context
        # ctx.term() below wakes it. With a shared context we can only stop waiting for it.
        for t in self._threads:
            t.join(timeout=1.0)
        for ctrl in self._controls:
            ctrl.close(linger=0)
        self._controls.clear()
        self._threads.clear()

    # --- registry ---------------------------------------------------------------------

    def _new_id(self, role: str, index: Any) -> tuple[str, int | None]:
        """(id, next number for ``role``; None when the id came from ``index``)."""
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return f"{role}-{index}", None
        n = self._counters.get(role, 0)
        while f"{role}-{n}" in self.roles and self.roles[f"{role}-{n}"].state == "alive":
            n += 1
        return f"{role}-{n}", n + 1

    @staticmethod
    def _hello_problem(m: dict[str, Any]) -> str | None:
        """Why a HELLO's fields cannot be registered, or None."""
        if not valid_name(m["role"]):
            return f"role names are 1 to {MAX_ID_CHARS} printable characters"
        if not valid_text(m["host"]):
            return f"host names are at most {MAX_FIELD_CHARS} printable characters"
        if not 0 <= m["pid"] < MAX_PID:
            return "pid out of range"
        for key in ("rpc", "address"):
            if m.get(key) is not None and not valid_text(m[key]):
                return f"{key} is at most {MAX_FIELD_CHARS} printable characters"
        wanted = m.get("id")
        if wanted is not None and not valid_name(wanted):
            return f"role ids are 1 to {MAX_ID_CHARS} printable characters"
        return None

    @staticmethod
    def _may_replace(old: RoleEntry, ident: bytes, m: dict[str, Any]) -> bool:
        """Whether a HELLO for ``old``'s id may take the id over. A live entry belongs to the
        connection that registered it; a restarted role waits until the old one is dead."""
        if old.state in ("dead", "stopped") or old.routing_id == ident:
            return True
        # Before its first heartbeat a role retries HELLO on a new socket when the reply to
        # the first came late; it tells the same pid and host.
        return old.state == "starting" and old.pid == m["pid"] and old.host == m["host"]

    def _forget_oldest_ended(self) -> bool:
        ended = [e for e in self.roles.values() if e.state in ("dead", "stopped")]
        if not ended:
            return False
        oldest = min(ended, key=lambda e: e.ended)
        del self.roles[oldest.id]
        log.info("forgot %s (registry full)", oldest.id)
        return True

    def _reply(self, to: bytes, kind: str, **meta: Any) -> None:
        self.registry.send(P.Message(kind, meta=meta), to=to, block=False)

    def _on_hello(self, ident: bytes, msg: P.Message) -> None:
        m = msg.meta
        P.require_meta(msg, {"role": str, "host": str, "pid": int})
        theirs = m.get("zrl_version")
        if theirs != __version__:
            self._reply(ident, P.REFUSED, reason=(
                f"zrl version mismatch: this broker runs zrl {__version__}, the role runs zrl {theirs}"
            ))  # fmt: skip
            return
        problem = self._hello_problem(m)
        if problem is not None:
            self._reply(ident, P.REFUSED, reason=f"bad HELLO: {problem}")
            self._reject(msg.sender, "bad hello", problem)
            return
        wanted = m.get("id")
        role = m["role"]
        next_n = None
        if isinstance(wanted, str) and wanted.startswith(role + "-"):
            rid = wanted
        else:
            rid, next_n = self._new_id(role, m.get("index"))
        if not valid_name(rid):
            reason = f"role ids are 1 to {MAX_ID_CHARS} printable characters"
            self._reply(ident, P.REFUSED, reason=f"bad HELLO: {reason}")
            self._reject(msg.sender, "bad hello", reason)
            return
        old = self.roles.get(rid)
        if old is not None and not self._may_replace(old, ident, m):
            # No answer, not REFUSED: a legitimately restarted role keeps saying HELLO with
            # back-off, and is welcome once the old entry misses its heartbeats (marked dead).
            self._reject(rid, "hello for a live id", (
                f"{rid} is registered by pid {old.pid} on {for_log(old.host)} from another "
                f"connection and is {old.state}: ignored until it is dead or stopped"
            ))  # fmt: skip
            return
        if old is None and len(self.roles) >= self.max_roles and not self._forget_oldest_ended():
            reason = f"the registry is full: {len(self.roles)} roles (broker.max_roles)"
            self._reply(ident, P.REFUSED, reason=reason)
            self._reject(msg.sender, "registry full", reason)
            return
        if next_n is not None:
            if role not in self._counters and len(self._counters) >= self.max_roles:
                self._counters.clear()  # numbering only skips live ids; it may start over
            self._counters[role] = next_n
        restarts = 0
        if old is not None:
            # Same id from a new process: a restart. From the same process: a reconnect.
            restarts = old.restarts + (1 if old.pid != m["pid"] or old.host != m["host"] else 0)
        entry = RoleEntry(
            id=rid,
            role=role,
            host=m["host"],
            pid=m["pid"],
            rpc=m.get("rpc") or "",
            routing_id=ident,
            address=m.get("address") or "",
            restarts=restarts,
        )
        self.roles[rid] = entry
        log.info("registered %s (host %s, pid %s)", rid, entry.host, entry.pid)
        spec = self.config.model_dump(mode="json") if self.config is not None else None
        welcome = P.Message(
            P.WELCOME,
            arrays={"factories": self._pickled} if self._pickled is not None else {},
            meta=dict(
                id=rid,
                spec=spec,
                endpoints=self.endpoints,
                streams=self.streams,
                heartbeat_interval=self.heartbeat_interval,
                heartbeat_timeout=self.heartbeat_timeout,
                max_message_bytes=self.max_message_bytes,
                max_topic_message_bytes=self.max_topic_message_bytes,
                zrl_version=__version__,
                broker_started=self.started,
                secure=self.keys is not None,
                factories=self.factories.references,
            ),
        )
        self.registry.send(welcome, to=ident, block=False)

    def _on_heartbeat(self, ident: bytes, msg: P.Message) -> None:
        rid = msg.meta.get("id")
        entry = self.roles.get(rid) if isinstance(rid, str) else None
        if entry is None or entry.state == "stopped":
            self._reply(ident, P.UNKNOWN_ROLE, id=rid)
            return
        if entry.routing_id != ident:
            if entry.state == "dead":
                # Its owner reconnected on a new socket: have it say HELLO again.
                self._reply(ident, P.UNKNOWN_ROLE, id=rid)
                return
            self._reject(rid, "heartbeat from another connection", (
                f"{rid} registered on another connection: a forged sender id, or the role "
                "reconnected (it is welcome again once the old entry is dead)"
            ))  # fmt: skip
            return
        if entry.state == "dead":
            log.warning("%s is heartbeating again after being marked dead", rid)
        entry.state = "alive"
        entry.last_seen = time.monotonic()
        entry.stats = clean_stats(msg.meta.get("stats"), entry.stats)
        info = msg.meta.get("info")
        if isinstance(info, dict):
            if info_fits(info, self.max_info_bytes):
                entry.info = info
            else:
                # The heartbeat still counts: a role must not die of its own status.
                self._note_drop(rid, "heartbeat info too large", (
                    f"more than {self.max_info_bytes} bytes or {MAX_INFO_ITEMS} items; "
                    "keeping the previous info"
                ))  # fmt: skip
        self._reply(ident, P.HEARTBEAT_ACK)

    def _on_bye(self, ident: bytes, msg: P.Message) -> None:
        rid = msg.meta.get("id")
        entry = self.roles.get(rid) if isinstance(rid, str) else None
        if entry is None or entry.state == "stopped":
            return  # e.g. a role stopping while its broker restarted
        if entry.routing_id != ident:
            self._reject(rid, "bye from another connection", f"{rid} registered on another one")
            return
        entry.state = "stopped"
        entry.ended = time.monotonic()
        entry.stats = clean_stats(msg.meta.get("stats"), entry.stats)
        log.info("%s said bye", rid)

    def status_rows(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [e.row(now) for e in sorted(self.roles.values(), key=lambda e: (e.role, e.id))]

    def _on_status(self, ident: bytes, msg: P.Message) -> None:
        self._reply(
            ident,
            P.STATUS_REPLY,
            roles=self.status_rows(),
            broker={
                "id": self.id,
                "bind": self.bind_address,
                "pid": os.getpid(),
                "uptime": round(time.time() - self.started, 1),
                "zrl_version": __version__,
                "registry": self.stats.snapshot(),
                "rejected": dict(self.rejected),
                "topic_dropped": self.topic_dropped,
                "limits": {
                    "max_roles": self.max_roles,
                    "max_info_bytes": self.max_info_bytes,
                    "forget_after": self.forget_after,
                    "topic_hwm": self.topic_hwm,
                    "small_topic_message_bytes": self.small_topic_message_bytes,
                    "bulk_topic_hwm": self.bulk_topic_hwm,
                    "max_topic_message_bytes": self.max_topic_message_bytes,
                },
                "experiment": self.config.name if self.config is not None else None,
            },
        )

    def _on_lookup(self, ident: bytes, msg: P.Message) -> None:
        role = msg.meta.get("role")
        services = [
            {"id": e.id, "rpc": e.rpc, "host": e.host}
            for e in self.roles.values()
            if e.role == role and e.state in ("starting", "alive") and e.rpc
        ]
        self._reply(ident, P.LOOKUP_REPLY, role=role, services=services)

    def _handle(self, ident: bytes, msg: P.Message) -> None:
        handler = {
            P.HELLO: self._on_hello,
            P.HEARTBEAT: self._on_heartbeat,
            P.BYE: self._on_bye,
            P.STATUS: self._on_status,
            P.LOOKUP: self._on_lookup,
        }.get(msg.kind)
        if handler is None:
            raise P.ProtocolError(f"registry does not serve {msg.kind!r}")
        handler(ident, msg)

    def _check_liveness(self) -> None:
        now = time.monotonic()
        died = 0
        for e in list(self.roles.values()):
            # A role sets up (imports, envs, models) between HELLO and its first heartbeat.
            window = self.setup_grace if e.state == "starting" else self.heartbeat_timeout
            if e.state in ("starting", "alive") and now - e.last_seen > window:
                e.state = "dead"
                e.ended = now
                died += 1
                if died <= MAX_DEAD_LOGGED:
                    log.warning(
                        "%s (host %s, pid %s) missed heartbeats for %.1fs: marked dead",
                        e.id, for_log(e.host), e.pid, now - e.last_seen,
                    )  # fmt: skip
            elif e.state in ("dead", "stopped") and now - e.ended > self.forget_after:
                del self.roles[e.id]
                log.info("forgot %s (%s for %.0fs)", e.id, e.state, now - e.ended)
        if died > MAX_DEAD_LOGGED:
            log.warning("%d more missed their heartbeats: marked dead", died - MAX_DEAD_LOGGED)

    def _recv_registry(self) -> tuple[bytes, P.Message] | None:
        try:
            frames = self.registry.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if len(frames) < 2:
            self.registry._drop("?", "no routing envelope")
            return None
        ident = frames[0].bytes
        try:
            msg = P.decode(frames[1:], max_bytes=self.max_message_bytes)
        except P.VersionMismatch as exc:
            # Answer so the peer can say exactly which versions disagree.
            self._reply(ident, P.REFUSED, reason=str(exc), protocol=P.PROTOCOL_VERSION)
            self.registry._drop(P.peek_sender(frames[1:]), str(exc))
            return None
        except P.ProtocolError as exc:
            self.registry._drop(P.peek_sender(frames[1:]), str(exc))
            return None
        self.registry.stats.received += 1
        return ident, msg

    def run(self) -> None:
        log.info("broker listening on %s (streams: %s)", self.bind_address, ", ".join(self.streams))
        poller = zmq.Poller()
        poller.register(self.registry.sock, zmq.POLLIN)
        next_check = time.monotonic()
        try:
            while not self._stop.is_set():
                if poller.poll(REGISTRY_POLL_MS):
                    for _ in range(1000):  # drain a burst, but keep checking liveness
                        got = self._recv_registry()
                        if got is None:
                            break
                        try:
                            self._handle(*got)
                        except P.ProtocolError as exc:
                            self.registry._drop(got[1].sender or "?", str(exc))
                        except Exception as exc:  # noqa: BLE001 - one message must not stop the broker
                            log.exception(
                                "registry failed on %s from %s", got[1].kind, got[1].sender
                            )
                            self.registry._drop(got[1].sender or "?", f"handler error: {exc!r}")
                if time.monotonic() >= next_check:
                    self._check_liveness()
                    next_check = time.monotonic() + LIVENESS_CHECK_S
        except zmq.ContextTerminated:
            pass
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._close_devices()
        if not self.registry.sock.closed:
            self.registry.close()
        if self._owns_ctx:
            stop_authenticator(self.ctx)
            self.ctx.term()
        log.info("broker stopped")
