"""The broker's topic bus: a Python forwarder with two lanes.

Sockets (see ``broker_endpoints`` for the ports):

- XSUB ``topics_in`` (P+1): every role's PUB publishes here (weights, metrics, eval,
  priorities/<shard>, acks, ...).
- XPUB ``topics_out`` (P+2): the small lane. Messages up to
  ``broker.small_topic_message_bytes`` go out here, queued up to ``broker.topic_hwm`` per
  subscriber.
- XPUB ``topics_bulk_out`` (after the streams): the bulk lane. Bigger messages (weights,
  rollouts), queued up to ``broker.bulk_topic_hwm``. Subscribers connect to both lanes;
  their subscriptions go up to XSUB as they are.

PUB semantics: a slow subscriber loses messages at its high-water mark, never blocks the
publisher. The forwarder passes frames by reference (never copies them) and drops any
message of more frames or bytes than a zrl message may have, counted as ``topic_dropped``:
libzmq bounds frames, not messages, so only that, and the two lanes, keep a stuck
subscriber's queue under ``topic_hwm`` x ``small_topic_message_bytes`` + ``bulk_topic_hwm`` x
``max_topic_message_bytes``: one lane with a single HWM either drops bursts of small messages
or queues gigabytes of large ones.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

import zmq

from zrl.broker.devices import Devices
from zrl.broker.limits import DropLog
from zrl.transport import protocol as P

FORWARD_BATCH = 256  # messages one direction of the topic bus moves before the other's turn
# topic frame + header frame + one frame per array: a message with more is not zrl's.
MAX_TOPIC_FRAMES = P.MAX_ARRAYS + 2


def topic_sockets(
    devices: Devices, *, hwm: int, bulk_hwm: int, buffer_bytes: int, max_message_bytes: int
) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket]:
    """The bus's XSUB ``topics_in``, XPUB ``topics_out`` and XPUB ``topics_bulk_out``, unbound.

    HWMs count messages, so bytes are bounded only with a message size bound too: a stuck
    subscriber's pipe holds at most ``hwm`` messages of at most ``max_message_bytes`` (the
    forwarder enforces that per message; MAXMSGSIZE is per frame) plus its kernel buffer. A
    busy but reading subscriber queues on its own side (its SUB's RCVHWM), so a small HWM
    here costs no legitimate message."""
    xsub = devices.socket(zmq.XSUB, hwm, buffer_bytes, max_message_bytes=max_message_bytes)
    xpub = devices.socket(zmq.XPUB, hwm, buffer_bytes, max_message_bytes=max_message_bytes)
    bulk = devices.socket(zmq.XPUB, bulk_hwm, buffer_bytes, max_message_bytes=max_message_bytes)
    for out in (xpub, bulk):
        # NODROP would make a stuck subscriber block the bus instead of losing its share.
        out.setsockopt(zmq.XPUB_NODROP, 0)
    return xsub, xpub, bulk


@dataclass(eq=False)
class TopicBus:
    """The forwarder between XSUB ``topics_in`` and the two XPUB lanes."""

    bulk: zmq.Socket
    _: KW_ONLY
    small_message_bytes: int
    max_message_bytes: int
    drops: DropLog
    dropped: int = field(default=0, init=False)  # messages over the frame or byte limit

    def forward(self, xsub: zmq.Socket, xpub: zmq.Socket, ctrl: zmq.Socket) -> None:
        """The topic bus: messages down (XSUB -> the small or the bulk XPUB by size, checked),
        subscriptions up from both (as they are), until TERMINATE arrives on ``ctrl``. Frames
        move by reference, never copied."""
        bulk = self.bulk
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
            dst = small if size <= self.small_message_bytes else bulk
            if check and (len(frames) > MAX_TOPIC_FRAMES or size > self.max_message_bytes):
                self.dropped += 1
                topic = frames[0].bytes[:64].decode("utf-8", "replace")
                self.drops.note(
                    topic,
                    "topic message too large",
                    (
                        f"{len(frames)} frames, {sum(len(f) for f in frames)} bytes (at most "
                        f"{MAX_TOPIC_FRAMES} frames and {self.max_message_bytes} bytes)"
                    ),
                )
                continue
            try:
                dst.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # XPUB drops at a full pipe itself; XSUB never blocks on subscriptions
