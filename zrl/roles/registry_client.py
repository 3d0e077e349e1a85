"""A role's side of the registry that needs no ``Role``: where peers reach us, and one-off
requests.

Sockets: a throwaway DEALER -> broker ROUTER ``registry`` per ``registry_request``
(STATUS, LOOKUP), used by roles, the supervisor, the CLI and the tests; ``read_status``
reads a whole STATUS listing page by page (or one role's row) on one throwaway DEALER. A role's own
registration (HELLO/WELCOME, HEARTBEAT, BYE) is ``Role``'s, in ``zrl.roles.base``.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import zmq
import zmq.utils.monitor

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


class NoAnswer(RoleError):
    """Nothing at all came back from the broker (not even a message that could not be read)."""


def registry_request(
    ctx: zmq.Context, broker: str, msg: P.Message, timeout: float = 5.0, keys: Keys | None = None
) -> P.Message:
    """One request to the broker registry on a throwaway DEALER (status, lookup). NoAnswer
    when nothing came; RoleError when what came could not be read."""
    sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=int(timeout * 1000), keys=keys)
    try:
        sock.connect(broker)
        return _ask(_client_channel(sock), broker, msg, f"{timeout:g}s")
    finally:
        sock.close(linger=0)


def _client_channel(sock: zmq.Socket) -> Channel:
    """A client's channel to the registry on the DEALER ``sock``."""
    return Channel(sock, "registry", f"client@{socket.gethostname()}", TransportStats())


def _ask(ch: Channel, broker: str, msg: P.Message, waited: str) -> P.Message:
    """Send ``msg`` on ``ch`` and return the answer (within the socket's receive timeout,
    ``waited`` in words). NoAnswer when nothing came; RoleError when what came could not be
    read."""
    ch.send(msg)
    got = ch.recv()
    if got is None:
        if ch.stats.dropped:
            raise RoleError(
                f"the answer of the broker at {broker} could not be read (malformed or "
                "over this client's limits)"
            )
        raise NoAnswer(f"no answer from a broker at {broker} within {waited}")
    return got[1]


_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
)


def refuses_handshake(
    ctx: zmq.Context, broker: str, timeout: float = 2.0, keys: Keys | None = None
) -> bool:
    """Whether a broker at ``broker`` is there but refuses this client's security handshake
    (a broker with --keys, a client without them or with other ones): only then is the
    cure for a silent broker to pass keys."""
    sock = make_socket(ctx, zmq.DEALER, keys=keys)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(_HANDSHAKE_FAILED))
    try:
        sock.connect(broker)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not monitor.poll(int(left * 1000) + 1):
                return False
            event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
            if event in _HANDSHAKE_FAILED:
                return True
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return False
        return False
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def read_status(
    ctx: zmq.Context,
    broker: str,
    timeout: float = 5.0,
    keys: Keys | None = None,
    *,
    role_id: str | None = None,
    host: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """The broker's STATUS as one map: ``roles`` (every row, read page by page; with
    ``role_id`` that role's whole row alone, or none; with ``host`` or ``role`` that host's or
    role's rows only)
    and ``broker`` (its figures, from the last page). A listing's rows carry the info and
    stream counters that fit a listing (``truncated`` marks a cut one); ``role_id`` gets
    the whole row. RoleError when a page does not come within what is left of ``timeout``,
    or the answer is not a STATUS reply."""
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    meta: dict[str, Any] = {}
    ask: dict[str, Any] = {"id": role_id} if role_id is not None else {}
    if host is not None:
        ask["host"] = host
    if role is not None:
        ask["role"] = role
    # One DEALER for every page: a connection (and its handshake) per page would cost more
    # than the page at thousands of roles.
    sock = make_socket(ctx, zmq.DEALER, keys=keys)
    try:
        sock.connect(broker)
        ch = _client_channel(sock)
        for _ in range(P.MAX_STATUS_PAGES):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoleError(f"no whole STATUS from a broker at {broker} within {timeout:g}s")
            sock.rcvtimeo = max(1, int(left * 1000))
            reply = _ask(ch, broker, P.Message(P.STATUS, meta=dict(ask)), f"{left:.3g}s")
            if reply.kind != P.STATUS_REPLY:
                raise RoleError(f"the broker at {broker} answered STATUS with {reply.kind}")
            meta = reply.meta
            page = meta.get("roles")
            rows.extend(page if isinstance(page, list) else [])
            last = meta.get("last")
            if not meta.get("more") or not isinstance(last, list) or last == ask.get("after"):
                break
            ask["after"] = last
    finally:
        sock.close(linger=0)
    return {**meta, "roles": rows}
