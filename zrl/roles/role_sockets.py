"""The sockets a role opens: on the broker's stream devices and topic bus, and its own rpc.

Sockets (every one counted in the role's ``stats`` and closed by ``Role.close``):

- PUSH -> ``S_in`` (:meth:`RoleSockets.open_push`) and PULL <- ``S_out``
  (:meth:`RoleSockets.open_pull`) of a stream device S: load-balanced, back-pressure.
- PUB -> XSUB ``topics_in`` (:meth:`RoleSockets.open_publisher`) and SUB <- both XPUB lanes
  ``topics_out``/``topics_bulk_out`` (:meth:`RoleSockets.open_subscriber`): the topic bus,
  with ``broker.max_topic_message_bytes`` as its message bound.
- SUB <- the host agent's weights relay (:meth:`RoleSockets.open_weights_subscriber`), an ipc
  XPUB in the agent's private directory named by ``WEIGHTS_RELAY_ENV``, for a role a host
  agent started; the broker's bus otherwise (``zrl.run.weights_relay``).
- ROUTER ``rpc`` (:meth:`RoleSockets.bind_rpc`): the role's own, which peers find with LOOKUP;
  DEALER -> another role's ``rpc`` (:meth:`RoleSockets.connect_rpc`).

``RoleSockets`` is a part of ``zrl.roles.base.Role``; the endpoints and limits it uses are
what the broker's WELCOME told the role.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import zmq

from zrl.config.experiment import ExperimentConfig
from zrl.roles.errors import RoleError
from zrl.transport.endpoints import connect_topics
from zrl.transport.security import Keys
from zrl.transport.senders import planned_ids
from zrl.transport.sockets import Channel, TransportStats, make_socket

WEIGHTS_RELAY_ENV = "ZRL_WEIGHTS_RELAY"
"""Where the host agent that started this role relays the weights topics: an ipc:// XPUB in
its private directory (``zrl.run.weights_relay``). Set by the agent only."""


class RoleSockets:
    """The socket methods of ``Role``, which sets every attribute below."""

    role: ClassVar[str]
    broker: str
    ctx: zmq.Context
    keys: Keys | None
    id: str
    advertise: str
    config: ExperimentConfig
    endpoints: dict[str, str]
    stats: TransportStats
    max_message_bytes: int
    max_topic_message_bytes: int
    rpc_endpoint: str
    _channels: list[Channel]

    def _channel(self, sock: zmq.Socket, name: str, **kw: Any) -> Channel:
        kw.setdefault("max_message_bytes", self.max_message_bytes)
        ch = Channel(sock, name, self.id, self.stats, **kw)
        # Sequence counters (gaps) follow the run's own roles only, never invented ids.
        ch.expected_peers = planned_ids(self.config.roles.counts())
        self._channels.append(ch)
        return ch

    def _sock(self, kind: int, **kw: Any) -> zmq.Socket:
        kw.setdefault("max_message_bytes", self.max_message_bytes)
        return make_socket(self.ctx, kind, keys=self.keys, **kw)

    def open_push(self, stream: str, *, hwm: int = 4, sndtimeo_ms: int = 100) -> Channel:
        """PUSH into a stream device: blocks (up to the timeout) when every consumer is full."""
        sock = self._sock(
            zmq.PUSH,
            sndhwm=hwm,
            sndtimeo_ms=sndtimeo_ms,
            kernel_buffer_bytes=self.config.broker.stream_buffer_bytes,
        )
        sock.connect(self._endpoint(f"{stream}_in"))
        return self._channel(sock, stream)

    def open_pull(self, stream: str, *, hwm: int = 4) -> Channel:
        sock = self._sock(
            zmq.PULL,
            rcvhwm=hwm,
            rcvtimeo_ms=100,
            kernel_buffer_bytes=self.config.broker.stream_buffer_bytes,
        )
        sock.connect(self._endpoint(f"{stream}_out"))
        return self._channel(sock, stream)

    # The topic bus carries smaller messages than the streams (``broker.max_topic_message_bytes``)
    # and queues few of them: a queue of ``hwm`` messages of that size is what a role that
    # stops reading a topic can be made to hold.
    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Channel:
        size = self.max_topic_message_bytes
        sock = self._sock(zmq.PUB, sndhwm=hwm, max_message_bytes=size)
        sock.connect(self.endpoints["topics_in"])
        return self._channel(sock, name, topics=True, max_message_bytes=size)

    def open_subscriber(
        self, topics: list[str], name: str | None = None, *, hwm: int = 1000
    ) -> Channel:
        size = self.max_topic_message_bytes
        sock = self._sock(zmq.SUB, rcvhwm=hwm, rcvtimeo_ms=100, max_message_bytes=size)
        for t in topics:
            sock.setsockopt(zmq.SUBSCRIBE, t.encode())
        connect_topics(sock, self.endpoints)
        return self._channel(sock, name or ",".join(topics), topics=True, max_message_bytes=size)

    def open_weights_subscriber(self, topics: list[str], name: str) -> Channel:
        """A SUB to weights ``topics``: from the host agent's relay (``WEIGHTS_RELAY_ENV``,
        ipc:// only; no keys, as the relay's socket lies in the agent's private directory) or,
        for a role no agent started, from the broker's bus (:meth:`open_subscriber`). What
        arrives is checked the same either way (``zrl.roles.weights``)."""
        relay = os.environ.get(WEIGHTS_RELAY_ENV) or ""
        if not relay:
            return self.open_subscriber(topics, name)
        if not relay.startswith("ipc://"):
            raise RoleError(
                f"{WEIGHTS_RELAY_ENV}={relay!r}: a host agent's weights relay is an ipc:// path"
            )
        size = self.max_topic_message_bytes
        sock = make_socket(self.ctx, zmq.SUB, rcvtimeo_ms=100, max_message_bytes=size)
        for t in topics:
            sock.setsockopt(zmq.SUBSCRIBE, t.encode())
        sock.connect(relay)
        return self._channel(sock, name, topics=True, max_message_bytes=size)

    def bind_rpc(
        self,
        *,
        sndhwm: int = 1000,
        kernel_buffer_bytes: int | None = None,
        mandatory: bool = False,
    ) -> Channel:
        """A ROUTER peers reach directly after a LOOKUP (bound before HELLO announces it).
        ``sndhwm`` and ``kernel_buffer_bytes`` bound what is queued for each peer that does
        not read; ``mandatory``: a reply to a peer whose queue is full fails (the channel's
        send returns False) instead of vanishing, and one to a peer gone raises ZMQError."""
        sock = self._sock(
            zmq.ROUTER,
            rcvtimeo_ms=100,
            server=True,
            sndhwm=sndhwm,
            kernel_buffer_bytes=kernel_buffer_bytes,
        )
        if mandatory:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self.broker.startswith("tcp://"):
            port = sock.bind_to_random_port(f"tcp://{self._bind_host()}")
            self.rpc_endpoint = f"tcp://{self.advertise}:{port}"
        else:
            self.rpc_endpoint = f"inproc://zrl-rpc-{self.role}-{id(self)}"
            sock.bind(self.rpc_endpoint)
        return self._channel(sock, "rpc", envelope=True)

    def connect_rpc(self, endpoint: str, routing_key: bytes, name: str, **kw: Any) -> Channel:
        """A DEALER to another role's rpc ROUTER (found with LOOKUP), connected under the
        routing id ``routing_key`` (see ``zrl.roles.rpc_identity``); ``kw`` are
        ``make_socket``'s options. Closed with the role, or before by :meth:`close_channel`."""
        sock = self._sock(zmq.DEALER, **kw)
        sock.setsockopt(zmq.ROUTING_ID, routing_key)
        sock.connect(endpoint)
        return self._channel(sock, name)

    def close_channel(self, channel: Channel, linger_ms: int = 0) -> None:
        """Close one of the role's channels before the role closes (a peer to find again)."""
        channel.close(linger_ms=linger_ms)
        self._channels.remove(channel)

    def _bind_host(self) -> str:
        return "127.0.0.1" if self.advertise.startswith("127.") else "*"

    def _endpoint(self, name: str) -> str:
        if name not in self.endpoints:
            raise RoleError(
                f"the broker runs no {name.rsplit('_', 1)[0]!r} stream "
                f"(it has: {', '.join(k[:-3] for k in self.endpoints if k.endswith('_in'))})"
            )
        return self.endpoints[name]
