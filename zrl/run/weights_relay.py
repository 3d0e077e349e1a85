"""The weights relay of a host agent: one copy of every weights version per host, not per role.

A ``WeightsRelay`` runs in a thread of the host agent (``zrl.run.host_agent``). Sockets:

- SUB -> both lanes of the broker's topic bus (``topics_out``, ``topics_bulk_out``), as a
  follower's own subscription would be, with the agent's keys. It subscribes only to the
  weights topics its children subscribed to, each once: ``weights`` and
  ``policy/<name>/weights`` (``is_weights_topic``), at most ``MAX_RELAY_TOPICS``.
- XPUB bound at ``ipc://<the agent's private 0700 directory>/weights``: the children's
  weights SUBs connect here (``zrl.roles.role_sockets.WEIGHTS_RELAY_ENV`` in their
  environment) instead of the broker. Their subscriptions arrive here and are passed up (a
  subscription to any other topic is ignored and counted).

Each message is relayed as the frames that arrived, by reference: nothing is decoded or
re-encoded, so the relay cannot alter what it relays, only drop it; the followers check what
they get exactly as they check the broker's bus (``zrl.roles.weights``). A message is dropped
(``dropped``) when its topic frame is not exactly one of the subscribed weights topics or it
has more frames or bytes than a topic message may have (as the bus drops it).

Bounded: the SUB queues at most ``RELAY_HWM`` messages, the relay holds at most one per topic
(the newest drained: an older one still held is ``superseded``), and each child's pipe holds at
most ``RELAY_HWM`` (a child that does not read loses versions there, as at the bus's bulk
lane; a follower takes the newest it finds and resyncs over the params rpc on a gap it cannot
bridge). The relay dies with the agent; the agent's children die with it too.
"""

from __future__ import annotations

import threading
from pathlib import Path

import zmq

from zrl.broker.topic_bus import FORWARD_BATCH, MAX_TOPIC_FRAMES
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.endpoints import connect_topics
from zrl.transport.security import Keys
from zrl.transport.sockets import make_socket

RELAY_HWM = 2
"""Messages queued on the relay's SUB, and per child on its XPUB."""
MAX_RELAY_TOPICS = 64
"""Weights topics (policies) one relay subscribes to at most."""
SUBSCRIPTION_BYTES = 256  # a subscription message: 1 byte + a topic
POLL_MS = 100


def is_weights_topic(topic: bytes) -> bool:
    """Whether ``topic`` is a policy's weights topic: ``weights`` or ``policy/<name>/weights``."""
    if topic == P.WEIGHTS_TOPIC.encode():
        return True
    parts = topic.split(b"/")
    if len(parts) != 3 or parts[0] != b"policy" or parts[2] != P.WEIGHTS_TOPIC.encode():
        return False
    try:
        name = parts[1].decode("ascii")
    except UnicodeDecodeError:
        return False
    return M.POLICY_NAME.fullmatch(name) is not None


class WeightsRelay:
    """A SUB to the broker's weights topics, republished raw on an ipc XPUB (module docstring)."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoints: dict[str, str],
        directory: Path,
        *,
        max_message_bytes: int,
        keys: Keys | None = None,
    ) -> None:
        """``endpoints``: the broker's (its WELCOME's); ``directory``: private (0700), where
        the XPUB binds; ``max_message_bytes``: the bus's topic message bound."""
        self.max_message_bytes = max_message_bytes
        self.endpoint = f"ipc://{directory / 'weights'}"
        self.sub = make_socket(
            ctx, zmq.SUB, rcvhwm=RELAY_HWM, max_message_bytes=max_message_bytes, keys=keys
        )
        connect_topics(self.sub, endpoints)
        self.out = make_socket(
            ctx, zmq.XPUB, sndhwm=RELAY_HWM, max_message_bytes=SUBSCRIPTION_BYTES
        )
        self.out.setsockopt(zmq.XPUB_NODROP, 0)  # a child that does not read loses, never blocks
        self.out.bind(self.endpoint)
        self.topics: set[bytes] = set()
        self.received = 0
        """Messages taken from the broker."""
        self.relayed = 0
        """Messages sent on to the children (once each, whatever their number)."""
        self.superseded = 0
        self.dropped = 0
        self.refused_subscriptions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Relay in a thread of its own, which owns both sockets from now on."""
        self._thread = threading.Thread(target=self._run, name="zrl-weights-relay", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (it closes the sockets); closes them here if it never started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._close_sockets()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _close_sockets(self) -> None:
        self.sub.close(linger=0)
        self.out.close(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        poller.register(self.out, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if self.out in ready:
                    self._subscriptions()
                if self.sub in ready:
                    self._send(self._drain())
        finally:
            self._close_sockets()

    def _subscriptions(self) -> None:
        """The children's (un)subscriptions, passed up for weights topics only. The XPUB
        reports a topic's first subscription and its last unsubscription."""
        for _ in range(FORWARD_BATCH):
            try:
                frames = self.out.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 1 or not frames[0] or frames[0][0] not in (0, 1):
                self.refused_subscriptions += 1
                continue
            subscribe, topic = frames[0][0] == 1, frames[0][1:]
            if subscribe and topic not in self.topics:
                if not is_weights_topic(topic) or len(self.topics) >= MAX_RELAY_TOPICS:
                    self.refused_subscriptions += 1
                    continue
                self.topics.add(topic)
                self.sub.setsockopt(zmq.SUBSCRIBE, topic)
            elif not subscribe and topic in self.topics:
                self.topics.discard(topic)
                self.sub.setsockopt(zmq.UNSUBSCRIBE, topic)

    def _drain(self) -> dict[bytes, list[zmq.Frame]]:
        """What the SUB holds, checked as the bus checks it: the newest message per topic."""
        newest: dict[bytes, list[zmq.Frame]] = {}
        for _ in range(FORWARD_BATCH):
            try:
                frames = self.sub.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.received += 1
            topic = frames[0].bytes
            size = sum(len(f) for f in frames)
            if (
                topic not in self.topics
                or len(frames) > MAX_TOPIC_FRAMES
                or size > self.max_message_bytes
            ):
                self.dropped += 1
                continue
            if topic in newest:
                self.superseded += 1
            newest[topic] = frames
        return newest

    def _send(self, newest: dict[bytes, list[zmq.Frame]]) -> None:
        for frames in newest.values():
            try:
                self.out.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:  # pragma: no cover - an XPUB without NODROP drops, never blocks
                self.dropped += 1
                continue
            self.relayed += 1
