"""Following the parameter server: the newest weights from the topic bus, and late join.

Used by every role that acts with the current policy (actors, the evaluator).
Sockets: SUB on topic ``weights``; a throwaway DEALER to the params rpc endpoint
for the one GET_WEIGHTS a late joiner needs.
"""

from __future__ import annotations

import zmq
from torch import nn

from zrl.models import load_arrays
from zrl.roles.base import Role
from zrl.transport import protocol as P
from zrl.transport.security import Keys
from zrl.transport.sockets import Channel, TransportStats, make_socket


class WeightsFollower:
    """Keeps a model at the newest weights version published (or served to a late joiner)."""

    def __init__(self, role: Role, model: nn.Module | None = None) -> None:
        self.role = role
        self.model = model
        self.sub = role.open_subscriber([P.WEIGHTS_TOPIC], "weights")
        self.version = 0

    def _newer(self, msg: P.Message) -> bool:
        version = msg.meta.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            self.sub._drop(msg.sender or "?", "weights without an integer version")
            return False
        return version > self.version

    def _apply(self, msg: P.Message) -> bool:
        """Load ``msg`` into the model; weights that do not fit are dropped, never fatal."""
        assert self.model is not None
        try:
            load_arrays(self.model, msg.arrays)
        except ValueError as exc:
            self.sub._drop(msg.sender or "?", f"weights do not fit the model: {exc}")
            return False
        self.version = int(msg.meta["version"])
        return True

    def update(self) -> bool:
        """Drain the subscription without blocking and apply the newest unseen version.

        True when the model changed."""
        candidates: list[P.Message] = []
        while True:
            got = self.sub.recv(block=False)
            if got is None:
                break
            if got[1].kind != P.WEIGHTS:
                self.sub._drop(got[1].sender or "?", f"{got[1].kind!r} on the weights topic")
            elif self._newer(got[1]):
                candidates.append(got[1])
        # Newest first; fall back to an older one if the newest does not fit.
        for msg in sorted(candidates, key=lambda m: m.meta["version"], reverse=True):
            if self._apply(msg):
                return True
        return False

    def fetch_latest(self, timeout: float = 2.0) -> bool:
        """Ask the parameter server directly (late join); True when weights were applied."""
        services = self.role.lookup("params", timeout=timeout)
        msg = request_latest_weights(
            self.role.ctx, services, self.role.max_message_bytes, timeout, self.role.keys
        )
        return msg is not None and msg.kind == P.WEIGHTS and self._newer(msg) and self._apply(msg)


def request_latest_weights(
    ctx: zmq.Context,
    services: list[dict],
    max_message_bytes: int,
    timeout: float = 2.0,
    keys: Keys | None = None,
) -> P.Message | None:
    """GET_WEIGHTS from the first parameter server in ``services`` (a LOOKUP answer) that has them."""
    for svc in services:
        sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=int(timeout * 1000),
                           max_message_bytes=max_message_bytes, keys=keys)  # fmt: skip
        try:
            sock.connect(svc["rpc"])
            ch = Channel(sock, "params-rpc", "weights-client", TransportStats())
            ch.send(P.Message(P.GET_WEIGHTS))
            got = ch.recv()
        finally:
            sock.close(linger=0)
        if got is not None and got[1].kind == P.WEIGHTS:
            return got[1]
    return None
