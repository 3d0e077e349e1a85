"""``CreditWindow``: messages sent and not yet acknowledged, each released only by its own ack.

An actor sends trajectories into a load-balanced stream and a replay shard acks each one it
inserted. The window bounds how many may be unacknowledged (staleness), and it is also the
loss ledger: a message no ack names within the timeout is counted lost, and an ack that
comes after all (a slow shard) turns that loss back into a delivery. Because an ack releases
exactly the sequence number it names, a consumer that takes messages and never acks them (a
stray PULL on the stream, a crashed shard) shows up as loss instead of hiding behind the acks
of later messages.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

# Expired sequence numbers remembered so a late ack still counts as a delivery.
MAX_EXPIRED_REMEMBERED = 4096


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
        self.timeout_s = timeout_s
        self.ledger = Ledger()
        self.timeouts = 0
        self._in_flight: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self._expired: OrderedDict[int, int] = OrderedDict()

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

    def ack(self, seq: int) -> bool:
        """Release ``seq``; False for a duplicate or an ack of nothing we have in flight."""
        if seq in self._in_flight:
            _, weight = self._in_flight.pop(seq)
        elif seq in self._expired:
            weight = self._expired.pop(seq)
            self.ledger.late += 1
            self.ledger.late_weight += weight
        else:
            return False
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

    def lose_all(self) -> int:
        """Count everything in flight as lost (the path to the consumer is known to be gone)."""
        n = len(self._in_flight)
        while self._in_flight:
            self._lose(next(iter(self._in_flight)))
        return n

    def _lose(self, seq: int) -> None:
        _, weight = self._in_flight.pop(seq)
        self.ledger.lost += 1
        self.ledger.lost_weight += weight
        self._expired[seq] = weight
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
