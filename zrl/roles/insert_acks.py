"""``InsertAcks``: an actor's side of replay's insert acknowledgements, the credit window they
release, and each shard's incarnation.

Every trajectory sent to replay counts as in flight until a shard's ACK (topic
``acks/<actor id>/``) names it; at most ``actor.max_in_flight`` may be (``CreditWindow``), which
bounds how stale replay's data can get. An ack releases exactly the trajectory it names; one
that no ack names within ``ACK_TIMEOUT_S`` (or three times the slowest recent ack, where a
loaded shard acks that slowly: ``zrl.transport.credit.AckLatency``) is counted lost, so a lost
ack or a shard that died unheard of never deadlocks the window. Acks carry the shard's
incarnation, which it also announces once a second (topic ``incarnations/``): a known shard
that speaks with a new one restarted, and what it held is counted lost at once
(``CreditWindow.lose_before`` says which).

Sockets: none of its own; it reads the actor's SUB on those two topics. A message there that
is no valid ack or announcement of a replay shard is dropped and counted on that channel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.credit import CreditWindow, Incarnations

ACK_TIMEOUT_S = 10.0  # then a lost ack, or a shard that died unheard of, no longer holds us back


class AckSource(Protocol):
    """What ``InsertAcks.read`` reads: the actor's SUB channel, or a test's feed."""

    def recv(self, *, block: bool = True) -> tuple[bytes | None, P.Message] | None: ...

    def drop(self, sender: str, reason: str) -> None: ...


class InsertAcks:
    """The credit window of one actor's trajectories to replay, and the acks that release it."""

    def __init__(self, limit: int, log: logging.Logger, next_seq: Callable[[], int]) -> None:
        self.window = CreditWindow(limit, ACK_TIMEOUT_S)
        self.incarnations = Incarnations()
        self.shard_restarts = 0
        self.log = log
        self.next_seq = next_seq
        """The sequence number the actor's output channel gives its next trajectory: an ack
        of one at or above it names nothing sent."""

    @property
    def in_flight(self) -> int:
        return self.window.in_flight

    def read(self, acks: AckSource) -> None:
        """Everything ``acks`` holds now."""
        while True:
            got = acks.recv(block=False)
            if got is None:
                return
            try:
                self.on_ack(got[1])
            except P.ProtocolError as exc:
                acks.drop(got[1].sender or "?", str(exc))

    def on_ack(self, msg: P.Message) -> None:
        """A replay shard's ACK of an insert, or its INCARNATION. Raises ProtocolError for
        anything else, which the caller counts and drops."""
        if msg.kind == P.INCARNATION:
            if not msg.sender.startswith("replay-"):
                raise P.ProtocolError(f"incarnation from {msg.sender}, not a replay shard")
            self.on_shard_incarnation(msg.sender, M.incarnation(msg.meta), None)
            return
        # Only a replay shard's ack of a trajectory we actually sent, and still count as
        # in flight (or lost), releases it; a duplicate is dropped like a forgery.
        seq = P.acked_seq(msg, "replay-", self.next_seq(), "trajectory")
        incarnation = M.incarnation(msg.meta)
        if not self.window.ack(seq):
            raise P.ProtocolError(f"ack of trajectory {seq} that is not in flight")
        self.on_shard_incarnation(msg.sender, incarnation, seq)

    def on_shard_incarnation(self, shard: str, incarnation: int, seq: int | None) -> None:
        """``shard`` spoke as ``incarnation``, in its ack of trajectory ``seq`` or (None) in its
        announcement. If it restarted since we last heard it, what it held is gone: count it
        lost now (``CreditWindow.lose_before`` says which and why) and reopen the window."""
        if not self.incarnations.restarted(shard, incarnation):
            return
        self.shard_restarts += 1
        lost = self.window.lose_before(seq)
        self.log.info(
            "%s restarted: %d trajectories in flight counted as lost (%d in total)",
            shard,
            lost,
            self.window.ledger.lost,
        )

    def expire(self) -> None:
        """Count trajectories no shard acknowledged within the window's timeout as lost: a lost
        ack, or a shard that died before we ever heard of it, must not deadlock the window."""
        lost = self.window.expire()
        if lost:
            # Before the first ack this is start-up (the shards may be slower to come up than
            # we are, and their late acks count as delivered), not a fault: a debug line, and
            # the count in ack_timeouts.
            self.log.log(
                logging.WARNING if self.window.ledger.delivered else logging.DEBUG,
                "%d trajectories unacknowledged by replay for %.0fs: counted as lost (%d in total)",
                lost,
                self.window.timeout_s,
                self.window.ledger.lost,
            )

    def lose_all(self, why: str) -> None:
        """Count every trajectory in flight as lost (the broker went away, or we stop without
        their acks), saying ``why`` in the log."""
        if self.in_flight > 0:
            lost = self.window.lose_all()
            self.log.warning(
                "%d trajectories %s: counted as lost (%d in total)",
                lost,
                why,
                self.window.ledger.lost,
            )

    def report(self) -> dict[str, Any]:
        """Heartbeat fields: what is in flight, and what was delivered and lost."""
        return {
            "in_flight": self.in_flight,
            "ack_timeouts": self.window.timeouts,
            "shard_restarts": self.shard_restarts,
            **self.window.report(),
        }
