"""``CreditWindow``: messages sent and not yet acknowledged, each released only by its own ack.

An actor sends trajectories into a load-balanced stream and a replay shard acks each one it
inserted. The window bounds how many may be unacknowledged (staleness), and it is also the
loss ledger: a message no ack names within the timeout is counted lost, and an ack that
comes after all (a slow shard) turns that loss back into a delivery. Because an ack releases
exactly the sequence number it names, a consumer that takes messages and never acks them (a
stray PULL on the stream, a crashed shard) shows up as loss instead of hiding behind the acks
of later messages.

A consumer that is alive but slow (a loaded machine: a replay shard whose FIFO is full acks
an insert only when its learner has made room) must not be taken for one that lost what it
was sent: that would open the window, let the producer run ahead, and fill the pipes with
data that is stale by the time it is used. So the timeout grows with the acknowledgements'
own latency (``AckLatency``), late ones included, from ``timeout_s`` up to ``MAX_TIMEOUT_S``.

``Incarnations`` tells an actor that a replay shard restarted: every start of a shard picks a
new incarnation and sends it with each ack (and once a second on its own). What the dead
incarnation held unacknowledged is gone, and waiting ``timeout_s`` for it only holds the
window shut; see ``CreditWindow.lose_before`` for what the actor counts lost then.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

# Expired sequence numbers remembered so a late ack still counts as a delivery.
MAX_EXPIRED_REMEMBERED = 4096
# Peers (replay shards) whose incarnations are remembered, and how many of each: the ids come
# off the topic bus, so the table is bounded; earlier incarnations are kept so that an ack of
# the old one still in transit is not taken for yet another restart.
MAX_PEERS = 1024
INCARNATIONS_REMEMBERED = 4
# A timeout grows to this many times the slowest recent acknowledgement, up to MAX_TIMEOUT_S:
# beyond it a consumer that acks that slowly is treated as gone all the same.
LATENCY_FACTOR = 3.0
MAX_TIMEOUT_S = 120.0


class AckLatency:
    """The timeout after which an unacknowledged message counts as lost: ``floor_s``, or
    :data:`LATENCY_FACTOR` times the slowest recent acknowledgement where that is longer (up to
    :data:`MAX_TIMEOUT_S`). Each acknowledgement's latency is observed; the remembered slowest
    decays by ``decay`` per observation, so the timeout falls again when the load does."""

    def __init__(self, floor_s: float, decay: float = 0.9) -> None:
        self.floor_s = floor_s
        self.decay = decay
        self.slowest_s = 0.0

    def observe(self, latency_s: float) -> None:
        self.slowest_s = max(latency_s, self.slowest_s * self.decay)

    @property
    def timeout_s(self) -> float:
        return min(MAX_TIMEOUT_S, max(self.floor_s, LATENCY_FACTOR * self.slowest_s))


@dataclass
class Ledger:
    """What was sent, delivered (acked) and lost, in messages and in a weight (env steps).

    Every figure only grows, so a reader can tell a restarted sender (figures fell) from a
    running one. ``late`` counts messages first counted lost and acked after all, so at any
    moment ``sent = delivered + (lost - late) + in flight``."""

    sent: int = 0
    delivered: int = 0
    lost: int = 0
    late: int = 0
    sent_weight: int = 0
    delivered_weight: int = 0
    lost_weight: int = 0
    late_weight: int = 0


class CreditWindow:
    """At most ``limit`` messages in flight; each leaves by its own ack or by timing out."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit = limit
        self.latency = AckLatency(timeout_s)
        self.ledger = Ledger()
        self.timeouts = 0
        # seq -> (when it was sent, its weight)
        self._in_flight: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self._expired: OrderedDict[int, tuple[float, int]] = OrderedDict()

    @property
    def timeout_s(self) -> float:
        """After this long unacknowledged a message counts lost (:class:`AckLatency`)."""
        return self.latency.timeout_s

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def full(self) -> bool:
        return len(self._in_flight) >= self.limit

    def sent(self, seq: int, weight: int = 0, now: float | None = None) -> None:
        self._in_flight[seq] = (time.monotonic() if now is None else now, weight)
        self.ledger.sent += 1
        self.ledger.sent_weight += weight

    def ack(self, seq: int, now: float | None = None) -> bool:
        """Release ``seq``; False for a duplicate or an ack of nothing we have in flight."""
        if seq in self._in_flight:
            sent_at, weight = self._in_flight.pop(seq)
        elif seq in self._expired:
            sent_at, weight = self._expired.pop(seq)
            self.ledger.late += 1
            self.ledger.late_weight += weight
        else:
            return False
        self.latency.observe((time.monotonic() if now is None else now) - sent_at)
        self.ledger.delivered += 1
        self.ledger.delivered_weight += weight
        return True

    def expire(self, now: float | None = None) -> int:
        """Count as lost every message unacknowledged for ``timeout_s``; how many were."""
        now = time.monotonic() if now is None else now
        expired = 0
        while self._in_flight:
            seq, (sent_at, _) = next(iter(self._in_flight.items()))
            if now - sent_at < self.timeout_s:
                break
            self._lose(seq)
            expired += 1
        if expired:
            self.timeouts += 1
        return expired

    def lose_before(self, seq: int | None = None) -> int:
        """Count as lost every message in flight that was sent before ``seq`` (sequence numbers
        grow in send order), or all of them with None; how many were.

        The rule for a replay shard that restarted. The stream load-balances, so the actor
        cannot tell which shard took which trajectory. It does know the order: its PUSH
        connection to the broker's device, the device's queue to each shard, and the shard's
        inserts are all first in, first out. So when the new incarnation acks ``seq``, each
        older trajectory still unacknowledged either went to the dead incarnation (lost for
        good) or waits at another shard (its ack is still coming); none waits at the new
        incarnation, which would have acked it first. Counting them all lost at once is exact
        with one shard; with several, the ones that were not lost come back as ``late``
        deliveries, so the ledger stays exact either way (meanwhile up to ``limit`` more
        messages than the window counts may really be in transit).

        When the restart is learnt from the shard's announcement instead (a window full of
        what the dead incarnation held sends nothing more, so no ack can come), there is no
        such boundary: everything in flight counts, and what the new incarnation or another
        shard still acks comes back as ``late`` in the same way."""
        lost = 0
        while self._in_flight:
            first = next(iter(self._in_flight))
            if seq is not None and first >= seq:
                break
            self._lose(first)
            lost += 1
        return lost

    def lose_all(self) -> int:
        """Count everything in flight as lost (the path to the consumer is known to be gone)."""
        return self.lose_before(None)

    def _lose(self, seq: int) -> None:
        sent_at, weight = self._in_flight.pop(seq)
        self.ledger.lost += 1
        self.ledger.lost_weight += weight
        self._expired[seq] = (sent_at, weight)
        while len(self._expired) > MAX_EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)

    def report(self) -> dict[str, int]:
        """The ledger as heartbeat figures (``trajectories_*`` and ``steps_*``)."""
        led = self.ledger
        return {
            "trajectories_sent": led.sent,
            "trajectories_delivered": led.delivered,
            "trajectories_lost": led.lost,
            "trajectories_late": led.late,
            "steps_sent": led.sent_weight,
            "steps_delivered": led.delivered_weight,
            "steps_lost": led.lost_weight,
            "steps_late": led.late_weight,
        }


class Incarnations:
    """The incarnations each peer (a replay shard id) was heard with, newest last."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, list[int]] = OrderedDict()

    def restarted(self, peer: str, incarnation: int) -> bool:
        """Note that ``peer`` spoke as ``incarnation``; True when that is a new one and an
        earlier one was known (the peer restarted since). The first incarnation heard of a
        peer is no restart: the actor cannot tell what came before it."""
        seen = self._seen.get(peer)
        if seen is None:
            self._seen[peer] = [incarnation]
            while len(self._seen) > MAX_PEERS:
                self._seen.popitem(last=False)
            return False
        self._seen.move_to_end(peer)
        if incarnation in seen:  # the current one, or a straggler of an earlier one
            return False
        seen.append(incarnation)
        del seen[:-INCARNATIONS_REMEMBERED]
        return True
