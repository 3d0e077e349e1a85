"""GET_WEIGHTS from a params server, without torch: what the head asks for the final weights
(``model_last.pt``), the league for a snapshot, and a weights follower when it resyncs.

Sockets: one throwaway DEALER per asked server (``P.GET_WEIGHTS`` out, ``P.WEIGHTS`` back).
"""

from __future__ import annotations

import zmq

from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.security import Keys
from zrl.transport.sockets import Channel, TransportStats, make_socket


def request_latest_weights(
    ctx: zmq.Context,
    services: list[dict],
    max_message_bytes: int,
    timeout: float = 2.0,
    keys: Keys | None = None,
    policy: str = M.DEFAULT_POLICY,
) -> P.Message | None:
    """GET_WEIGHTS of ``policy`` from the first parameter server in ``services`` (a LOOKUP
    answer) that has them."""
    for svc in services:
        sock = make_socket(
            ctx,
            zmq.DEALER,
            rcvtimeo_ms=int(timeout * 1000),
            max_message_bytes=max_message_bytes,
            keys=keys,
        )
        try:
            sock.connect(svc["rpc"])
            ch = Channel(sock, "params-rpc", "weights-client", TransportStats())
            ch.send(P.Message(P.GET_WEIGHTS, meta=M.policy_meta(policy)))
            got = ch.recv()
        finally:
            sock.close(linger=0)
        if got is not None and got[1].kind == P.WEIGHTS:
            return got[1]
    return None
