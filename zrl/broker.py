"""The broker: the one well-known address of a zrl experiment.

Sockets (base address tcp://H:P; see ``broker_endpoints`` for the full layout):

- ROUTER ``registry`` (P): roles say HELLO and get WELCOME (their id, the experiment
  spec, the stream endpoints), then HEARTBEAT (answered with HEARTBEAT_ACK) and BYE;
  anyone may ask LOOKUP (a service's rpc endpoints) and STATUS (the role table).
- XSUB ``topics_in`` (P+1) / XPUB ``topics_out`` (P+2): the topic bus (weights,
  metrics, priorities/<shard>). PUB semantics: a slow subscriber loses messages at its
  high-water mark, never blocks the publisher.
- per stream S: PULL ``S_in`` / PUSH ``S_out``: load-balanced pipelines (experience,
  batches, ...). PUSH semantics: a full queue blocks the producer (back-pressure).

The devices are ``zmq.proxy_steerable`` running in C in their own threads; no
stream byte passes through Python here. Only the registry is Python, and it
validates every message it reads (malformed ones are counted and dropped).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from zrl import __version__
from zrl.config import DEFAULT_STREAMS, ExperimentConfig
from zrl.experiment import Factories
from zrl.transport import protocol as P
from zrl.transport.security import Keys, stop_authenticator
from zrl.transport.sockets import Channel, TransportStats, broker_endpoints, make_socket

log = logging.getLogger("zrl.broker")

REGISTRY_POLL_MS = 100
LIVENESS_CHECK_S = 0.25


STAT_COUNTERS = ("sent", "received", "dropped", "gaps")


def clean_stats(raw: Any, previous: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """A role's reported stream counters, keeping only well-formed ones (a peer may lie)."""
    if not isinstance(raw, dict):
        return previous
    clean: dict[str, dict[str, int]] = {}
    for stream, counters in raw.items():
        if isinstance(stream, str) and isinstance(counters, dict):
            clean[stream] = {
                k: v
                for k in STAT_COUNTERS
                if isinstance(v := counters.get(k, 0), int) and not isinstance(v, bool)
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
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def row(self, now: float) -> dict[str, Any]:
        received = sum(s.get("received", 0) for s in self.stats.values())
        sent = sum(s.get("sent", 0) for s in self.stats.values())
        dropped = sum(s.get("dropped", 0) for s in self.stats.values())
        gaps = sum(s.get("gaps", 0) for s in self.stats.values())
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
        self.bind_address = bind
        self.endpoints = broker_endpoints(bind, self.streams)
        # An own context lets close() end devices blocked on a full queue (ctx.term() wakes
        # them with ETERM); in-process mode shares the caller's context for inproc://.
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stats = TransportStats()
        self.roles: dict[str, RoleEntry] = {}
        self._counters: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._controls: list[zmq.Socket] = []
        self.started = time.time()
        self.id = f"broker@{socket.gethostname()}"

        registry = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=self.max_message_bytes,
                               keys=keys, server=True)  # fmt: skip
        self._bind(registry, "registry")
        self.registry = Channel(
            registry, "registry", self.id, self.stats, envelope=True,
            max_message_bytes=self.max_message_bytes,
        )  # fmt: skip
        # Topic bus: large HWMs so a weights burst is not dropped for a subscriber that is
        # merely busy; a truly stuck subscriber still cannot grow the broker's memory unbounded.
        xsub = self._device_socket(zmq.XSUB, 10_000)
        xpub = self._device_socket(zmq.XPUB, 10_000)
        self._bind(xsub, "topics_in")
        self._bind(xpub, "topics_out")
        self._start_device("topics", xsub, xpub)
        for name in self.streams:
            pull = self._device_socket(zmq.PULL, self.stream_hwm, self.stream_buffer_bytes)
            push = self._device_socket(zmq.PUSH, self.stream_hwm, self.stream_buffer_bytes)
            self._bind(pull, f"{name}_in")
            self._bind(push, f"{name}_out")
            self._start_device(name, pull, push)

    def _device_socket(self, kind: int, hwm: int, kernel_buffer: int | None = None) -> zmq.Socket:
        # No timeouts: zmq_proxy gives up for good on the first EAGAIN, losing the message in
        # flight and the whole device. A full PUSH side must block (back-pressure) instead.
        return make_socket(self.ctx, kind, sndhwm=hwm, rcvhwm=hwm, rcvtimeo_ms=-1, sndtimeo_ms=-1,
                           max_message_bytes=self.max_message_bytes,
                           kernel_buffer_bytes=kernel_buffer, keys=self.keys, server=True)  # fmt: skip

    def _bind(self, sock: zmq.Socket, name: str) -> None:
        addr = self.endpoints[name]
        try:
            sock.bind(addr)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._close_devices()
            raise OSError(f"broker cannot bind {name} at {addr}: {exc}") from None

    def _start_device(self, name: str, frontend: zmq.Socket, backend: zmq.Socket) -> None:
        ctrl_addr = f"inproc://zrl-broker-ctrl-{id(self)}-{name}"
        ctrl_server = make_socket(self.ctx, zmq.PAIR, rcvtimeo_ms=-1)
        ctrl_server.bind(ctrl_addr)
        ctrl_client = make_socket(self.ctx, zmq.PAIR)
        ctrl_client.connect(ctrl_addr)
        self._controls.append(ctrl_client)

        def device() -> None:
            try:
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

    def _new_id(self, role: str, index: Any) -> str:
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return f"{role}-{index}"
        n = self._counters.get(role, 0)
        while f"{role}-{n}" in self.roles and self.roles[f"{role}-{n}"].state == "alive":
            n += 1
        self._counters[role] = n + 1
        return f"{role}-{n}"

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
        wanted = m.get("id")
        role = m["role"]
        if isinstance(wanted, str) and wanted.startswith(role + "-"):
            rid = wanted
        else:
            rid = self._new_id(role, m.get("index"))
        old = self.roles.get(rid)
        restarts = 0
        if old is not None:
            # Same id from a new process: a restart. From the same process: a reconnect.
            restarts = old.restarts + (1 if old.pid != m["pid"] or old.host != m["host"] else 0)
            if old.state == "alive" and old.pid != m["pid"] and old.routing_id != ident:
                log.warning("%s re-registered from pid %s (was pid %s)", rid, m["pid"], old.pid)
        entry = RoleEntry(
            id=rid,
            role=role,
            host=m["host"],
            pid=m["pid"],
            rpc=str(m.get("rpc", "")),
            routing_id=ident,
            address=str(m.get("address", "")),
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
        if entry.state == "dead":
            log.warning("%s is heartbeating again after being marked dead", rid)
        entry.state = "alive"
        entry.routing_id = ident
        entry.last_seen = time.monotonic()
        entry.stats = clean_stats(msg.meta.get("stats"), entry.stats)
        info = msg.meta.get("info")
        if isinstance(info, dict):
            entry.info = info
        self._reply(ident, P.HEARTBEAT_ACK)

    def _on_bye(self, ident: bytes, msg: P.Message) -> None:
        rid = msg.meta.get("id")
        entry = self.roles.get(rid) if isinstance(rid, str) else None
        if entry is not None:
            entry.state = "stopped"
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
        for e in self.roles.values():
            # A role sets up (imports, envs, models) between HELLO and its first heartbeat.
            window = self.setup_grace if e.state == "starting" else self.heartbeat_timeout
            if e.state in ("starting", "alive") and now - e.last_seen > window:
                e.state = "dead"
                log.warning(
                    "%s (host %s, pid %s) missed heartbeats for %.1fs: marked dead",
                    e.id, e.host, e.pid, now - e.last_seen,
                )  # fmt: skip

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
