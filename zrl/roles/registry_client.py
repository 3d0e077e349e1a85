"""A role's side of the registry that needs no ``Role``: where peers reach us, and one-off
requests.

Sockets: a throwaway DEALER -> broker ROUTER ``registry`` per ``registry_request``
(STATUS, LOOKUP), used by roles, the supervisor, the CLI and the tests. A role's own
registration (HELLO/WELCOME, HEARTBEAT, BYE) is ``Role``'s, in ``zrl.roles.base``.
"""

from __future__ import annotations

import socket

import zmq

from zrl.roles.errors import RoleError
from zrl.transport import protocol as P
from zrl.transport.endpoints import split_tcp
from zrl.transport.security import Keys
from zrl.transport.sockets import Channel, TransportStats, make_socket


def advertise_host_for(broker: str) -> str:
    """The local address peers can reach us at: the interface that routes to the broker.

    A UDP connect sends nothing; it only asks the kernel which source address it would use."""
    if not broker.startswith("tcp://"):
        return "127.0.0.1"
    host, port = split_tcp(broker)
    host = host.strip("[]")
    if host in ("localhost", "127.0.0.1", "0.0.0.0", "*"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def registry_request(
    ctx: zmq.Context, broker: str, msg: P.Message, timeout: float = 5.0, keys: Keys | None = None
) -> P.Message:
    """One request to the broker registry on a throwaway DEALER (status, lookup)."""
    sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=int(timeout * 1000), keys=keys)
    try:
        sock.connect(broker)
        ch = Channel(sock, "registry", f"client@{socket.gethostname()}", TransportStats())
        ch.send(msg)
        got = ch.recv()
        if got is None:
            raise RoleError(f"no answer from a broker at {broker} within {timeout:g}s")
        return got[1]
    finally:
        sock.close(linger=0)
