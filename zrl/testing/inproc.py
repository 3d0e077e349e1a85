"""``InProc``: a whole zrl experiment inside the test's process.

One ``Broker`` over ``inproc://`` on the test's zmq context, roles in threads (each with its own
stop event, its exceptions kept for :meth:`InProc.error_of`), and the test's own sockets on the
broker's streams and topic bus, all with linger 0 and finite timeouts. :meth:`InProc.close`
stops every thread and closes every socket; a test file wraps it in a fixture::

    @pytest.fixture
    def inproc(zmq_ctx):
        h = InProc(zmq_ctx, "replay")
        try:
            yield h
        finally:
            h.close()

Topic-bus waits (see :mod:`zrl.testing.probes`): :meth:`InProc.wait_subscribed` once the test's
SUB may miss nothing more, :meth:`InProc.wait_for_subscriber` once a role's subscription reached
the test's publisher. Receiving: :func:`collect` and :func:`collect_acking`.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import zmq

from zrl.broker.broker import Broker
from zrl.config.experiment import ExperimentConfig
from zrl.roles.base import Role
from zrl.testing.probes import (
    DEFAULT_TIMEOUT_S,
    PROBE_SENDER,
    wait_for,
    wait_for_subscriber,
    wait_subscribed,
)
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel, TransportStats, make_socket

_names = itertools.count()


class InProc:
    """One inproc broker, roles in threads, test sockets; ``close()`` stops and closes all."""

    def __init__(self, ctx: zmq.Context, name: str) -> None:
        self.ctx = ctx
        self.addr = f"inproc://zrl-test-{name}-{os.getpid()}-{next(_names)}"
        self.broker: Broker | None = None
        self._broker_thread: threading.Thread | None = None
        self.roles: list[tuple[Role, threading.Thread, dict[str, BaseException]]] = []
        self.channels: list[Channel] = []
        self._sub_topics: dict[int, tuple[str, ...]] = {}
        self._probe: Channel | None = None

    def start_broker(self, cfg: ExperimentConfig) -> Broker:
        self.broker = Broker(self.addr, cfg, ctx=self.ctx)
        self._broker_thread = threading.Thread(
            target=self.broker.run, name="test-broker", daemon=True
        )
        self._broker_thread.start()
        return self.broker

    def start(self, cls: type[Role], index: int | None = None) -> Role:
        """Run a role in a thread and wait until its ``setup()`` is done."""
        role = cls(self.addr, index=index, ctx=self.ctx, connect_timeout=10)
        errors: dict[str, BaseException] = {}

        def run() -> None:
            try:
                role.run()
            except BaseException as exc:  # reported by error_of(), not lost in the thread
                errors["error"] = exc

        t = threading.Thread(target=run, name=f"test-{cls.role}-{index}", daemon=True)
        t.start()
        self.roles.append((role, t, errors))
        wait_for(lambda: role.state == "running" or errors, timeout=30)
        assert not errors, f"{cls.role} failed to start: {errors.get('error')!r}"
        return role

    def error_of(self, role: Role) -> BaseException | None:
        for r, _, errors in self.roles:
            if r is role:
                return errors.get("error")
        raise KeyError(role)

    def alive(self, role: Role) -> bool:
        return any(r is role and t.is_alive() for r, t, _ in self.roles)

    def stop_role(self, role: Role) -> None:
        for r, t, _ in self.roles:
            if r is role:
                r.request_stop()
                t.join(10)
                assert not t.is_alive(), f"{r.id} did not stop"

    def _socket(self, kind: int, endpoint: str, **kw: Any) -> zmq.Socket:
        assert self.broker is not None
        sock = make_socket(self.ctx, kind, **kw)
        sock.connect(self.broker.endpoints[endpoint])
        return sock

    def _track(self, ch: Channel) -> Channel:
        self.channels.append(ch)
        return ch

    def push(self, stream: str, sender: str = "actor-0") -> Channel:
        sock = self._socket(zmq.PUSH, f"{stream}_in", sndtimeo_ms=2000)
        return self._track(Channel(sock, stream, sender, TransportStats()))

    def pull(self, stream: str) -> Channel:
        sock = self._socket(zmq.PULL, f"{stream}_out", rcvtimeo_ms=100)
        return self._track(Channel(sock, stream, "test", TransportStats()))

    def sub(self, *topics: str) -> Channel:
        sock = self._socket(zmq.SUB, "topics_out", rcvtimeo_ms=100)
        assert self.broker is not None
        sock.connect(self.broker.endpoints["topics_bulk_out"])
        for t in topics:
            sock.setsockopt(zmq.SUBSCRIBE, t.encode())
        ch = self._track(Channel(sock, "sub", "test", TransportStats(), topics=True))
        self._sub_topics[id(ch)] = topics
        return ch

    def pub(self, sender: str = "test") -> Channel:
        """A publisher on the topic bus. Its socket is an XPUB (it publishes as a PUB does) so
        that :meth:`wait_for_subscriber` can see the subscriptions it learned."""
        sock = self._socket(zmq.XPUB, "topics_in")
        return self._track(Channel(sock, "pub", sender, TransportStats(), topics=True))

    def probe_pub(self) -> Channel:
        """The harness's own publisher: probes, and watching which topics have subscribers."""
        if self._probe is None:
            self._probe = self.pub(PROBE_SENDER)
        return self._probe

    def wait_subscribed(
        self, sub: Channel, *topics: str, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[P.Message]:
        """Wait until ``sub`` (from :meth:`sub`) receives what is published on each of
        ``topics`` (default: every topic it subscribed to), whoever publishes it: probes go out
        through :meth:`probe_pub`, and the broker passes a subscription to all publishers at
        once, the roles' included. Only for topics no role subscribes to (a role would receive
        the probes). Returns the other messages ``sub`` received meanwhile (normally none)."""
        others: list[P.Message] = []
        for topic in topics or self._sub_topics.get(id(sub), ()):
            others += wait_subscribed(self.probe_pub(), sub, topic, timeout=timeout)
        return others

    def wait_for_subscriber(
        self, *topics: str, pub: Channel | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Wait until a subscription to each of ``topics`` (a role's) reached ``pub`` (from
        :meth:`pub`), so that nothing it publishes there is dropped for want of a subscriber.
        Without ``pub``: until it reached the harness's :meth:`probe_pub`, and so every
        publisher connected to the broker, the roles' included. Nothing is sent."""
        for topic in topics:
            wait_for_subscriber(pub or self.probe_pub(), topic, timeout=timeout)

    def close(self) -> None:
        for r, _, _ in self.roles:
            # Tests end with trajectories in flight that no shard will ever ack.
            if hasattr(r, "eos_timeout_s"):
                r.eos_timeout_s = 0.0  # type: ignore[attr-defined]
            r.request_stop()
        for r, t, _ in self.roles:
            t.join(10)
            assert not t.is_alive(), f"{r.id or r.role} did not stop"
        for ch in self.channels:
            ch.close()
        if self.broker is not None and self._broker_thread is not None:
            self.broker.stop()
            self._broker_thread.join(10)
            assert not self._broker_thread.is_alive(), "broker did not stop"


def collect(
    ch: Channel, *, quiet: float = 0.6, timeout: float = 15.0, until: int | None = None
) -> list[P.Message]:
    """Receive until ``until`` messages arrived, or nothing came for ``quiet`` seconds."""
    out: list[P.Message] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < deadline:
        got = ch.recv()  # waits up to the socket's 100 ms timeout
        if got is not None:
            out.append(got[1])
            last = time.monotonic()
            if until is not None and len(out) >= until:
                break
        elif until is None and time.monotonic() - last > quiet:
            break
    return out


def collect_acking(
    batches: Channel, acks: Channel, *, quiet: float = 0.6, until: int | None = None
) -> list[P.Message]:
    """``collect`` as a learner does it: each batch acknowledged to its shard on receipt."""
    out: list[P.Message] = []
    while until is None or len(out) < until:
        got = collect(batches, quiet=quiet, until=1)
        if not got:
            break
        out += got
        acks.send(
            P.Message(P.ACK, meta={"seq": got[0].seq}),
            topic=P.batch_ack_topic(got[0].meta["shard"]),
        )
    return out
