"""Following the parameter server: the newest weights from the topic bus, and late join.

Used by every role that acts with the current policy (actors, the evaluator).
Sockets: SUB on topic ``weights``; a throwaway DEALER to the params rpc endpoint
for the one GET_WEIGHTS a late joiner needs.
"""

from __future__ import annotations

import zmq

from zrl.roles.base import Role
from zrl.transport import protocol as P
from zrl.transport.security import Keys
from zrl.transport.sockets import Channel, TransportStats, make_socket


class WeightsFollower:
    """Tracks the newest weights version; ``newest()`` returns a message only when it is newer."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.sub = role.open_subscriber([P.WEIGHTS_TOPIC], "weights")
        self.version = 0

    def _newer(self, msg: P.Message) -> bool:
        version = msg.meta.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            self.sub._drop(msg.sender or "?", "weights without an integer version")
            return False
        return version > self.version

    def newest(self) -> P.Message | None:
        """Drain the subscription without blocking; the newest unseen version, if any."""
        best: P.Message | None = None
        while True:
            got = self.sub.recv(block=False)
            if got is None:
                break
            msg = got[1]
            if msg.kind == P.WEIGHTS and self._newer(msg):
                if best is None or msg.meta["version"] > best.meta["version"]:
                    best = msg
        if best is not None:
            self.version = int(best.meta["version"])
        return best

    def fetch_latest(self, timeout: float = 2.0) -> P.Message | None:
        """Ask the parameter server directly (late join). None if there is none yet."""
        services = self.role.lookup("params", timeout=timeout)
        msg = request_latest_weights(
            self.role.ctx, services, self.role.max_message_bytes, timeout, self.role.keys
        )
        if msg is not None and self._newer(msg):
            self.version = int(msg.meta["version"])
            return msg
        return None


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
