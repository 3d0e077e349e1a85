"""Who is at the other end of a role's rpc connection: the registry's word, never the message's.

A request on a role's rpc ROUTER carries a sender id (``s``), but anyone who can reach the
port can write any id there. What only the real role can do is heartbeat on the registry
connection that registered its id (the broker drops a HEARTBEAT for a live id from another
connection). So a client role that must be known to a server (the learner to params, the
league to params, an actor to the league):

- connects its DEALER with a routing id it draws at random (:func:`new_routing_key`), which
  only it and the server see;
- shows the SHA-256 of that key in its heartbeat info, ``rpc_keys: {<server role>: <hex>}``
  (:class:`ClientKeys`), which anyone may read in STATUS but nobody can turn back into the key;
  it sends its first guarded request on that connection once the broker acknowledged a
  heartbeat showing the key (``Role.heartbeat_now``), and sends it again if no answer came.

The server (:class:`RegisteredPeers`) takes a guarded request only from a routing id whose
digest a live registry entry of an allowed role shows: it looks in the rows of its last
STATUS, asks STATUS again at most once per ``STATUS_INTERVAL_S`` while a connection is unknown
(a flood of unknown connections costs one query per interval, and the real client finds its
key in the next one), and remembers at most ``MAX_KNOWN_PEERS`` connections it confirmed. A
guarded request from an unknown connection that arrives while it may not ask yet is parked
(at most ``MAX_PARKED_PER_PEER`` per connection and ``MAX_PARKED`` connections, the oldest
dropped)
and handled again once it may: a client's first request right after its key showed is not
lost to a query made just before, nor to another connection's flood. Without keys
(CURVE) a process that sees the traffic can still copy a routing id; see
docs/security.md.

Sockets: a throwaway DEALER to the broker per STATUS page (``zrl.roles.registry_client``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from zrl.roles.errors import RoleError
from zrl.roles.registry_client import read_status
from zrl.transport import protocol as P

KEYS_INFO = "rpc_keys"
"""The heartbeat info field of a client role: {server role: SHA-256 hex of its routing id}."""
STATUS_INTERVAL_S = 0.5
STATUS_TIMEOUT_S = 1.0
MAX_KNOWN_PEERS = 64
MAX_PARKED = 8
"""Connections with requests parked at once."""
MAX_PARKED_PER_PEER = 4
LIVE_STATES = ("starting", "alive")

log = logging.getLogger(__name__)


def new_routing_key() -> bytes:
    """A random routing id for a DEALER (libzmq reserves ids starting with a zero byte)."""
    return b"k" + secrets.token_bytes(16)


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def connect_with_key(sock: zmq.Socket, endpoint: str, key: bytes) -> None:
    """Connect ``sock`` (a DEALER) to ``endpoint`` under the routing id ``key``."""
    sock.setsockopt(zmq.ROUTING_ID, key)
    sock.connect(endpoint)


class ClientKeys:
    """The routing ids a client role connects with, one per server role, and the heartbeat
    info that shows their digests."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def renew(self, server: str) -> bytes:
        """A fresh key for a new connection to ``server`` (a reconnect gets a new one: the
        server may still hold the old connection)."""
        self.keys[server] = new_routing_key()
        return self.keys[server]

    def info(self) -> dict[str, Any]:
        if not self.keys:
            return {}
        return {KEYS_INFO: {server: key_digest(k) for server, k in self.keys.items()}}


class Parked(Exception):
    """A guarded request parked until the registry may be asked about its connection."""


@dataclass(frozen=True)
class Peer:
    """A connection the registry vouches for: the id and role of the entry showing its key."""

    id: str
    role: str


class RegisteredPeers:
    """The rpc connections of a server role that live registry entries vouch for.

    ``allowed(row)`` says whether a STATUS row's role may use this server for what is guarded
    (e.g. a planned learner); ``status`` asks the registry (a role's STATUS request); at most
    ``max_known`` confirmed connections are remembered (the least recently used forgotten)."""

    def __init__(
        self,
        server: str,
        status: Callable[[], list[dict[str, Any]]],
        allowed: Callable[[dict[str, Any]], bool],
        max_known: int = MAX_KNOWN_PEERS,
    ) -> None:
        self.server = server
        self.max_known = max_known
        self.status = status
        self.allowed = allowed
        self.known: OrderedDict[bytes, Peer] = OrderedDict()
        self.next_status = 0.0
        self.queries = 0
        self.vouched_now: dict[str, Peer] = {}  # of the last STATUS
        self.deferred = False  # the last identify missed without asking (the interval)
        self.parked: OrderedDict[bytes, deque[P.Message]] = OrderedDict()
        """The waiting requests of each unknown connection, oldest connection first."""

    def identify(self, ident: bytes) -> Peer | None:
        """The registered peer whose key ``ident`` is, or None (asking STATUS at most once
        per ``STATUS_INTERVAL_S``)."""
        peer = self.known.get(ident)
        if peer is not None:
            self.known.move_to_end(ident)
            return peer
        digest = key_digest(ident)
        peer = self.vouched_now.get(digest)
        now = time.monotonic()
        self.deferred = peer is None and now < self.next_status
        if peer is None and now >= self.next_status:
            self.next_status = now + STATUS_INTERVAL_S
            self.queries += 1
            try:
                self.vouched_now = self.vouched(self.status())
            except RoleError as exc:  # broker away for now: unknown until it answers
                log.debug("status for rpc peers failed: %s", exc)
            peer = self.vouched_now.get(digest)
        if peer is not None:
            self.known[ident] = peer
            while len(self.known) > self.max_known:
                self.known.popitem(last=False)
        return peer

    def vouched(self, rows: list[dict[str, Any]]) -> dict[str, Peer]:
        """{digest: peer} of the live, allowed rows showing a key for this server."""
        out: dict[str, Peer] = {}
        for row in rows:
            if not isinstance(row, dict) or row.get("state") not in LIVE_STATES:
                continue
            info = row.get("info")
            keys = info.get(KEYS_INFO) if isinstance(info, dict) else None
            digest = keys.get(self.server) if isinstance(keys, dict) else None
            rid, role = row.get("id"), row.get("role")
            if isinstance(digest, str) and isinstance(rid, str) and isinstance(role, str):
                if self.allowed(row):
                    out[digest] = Peer(rid, role)
        return out

    def park(self, ident: bytes, msg: P.Message) -> P.Message | None:
        """Hold ``msg`` until :meth:`unpark`, fairly and in order: a connection keeps at most
        ``MAX_PARKED_PER_PEER`` requests parked (past that its own oldest is dropped, and
        returned), and past ``MAX_PARKED`` connections the longest-waiting connection's
        oldest request is. One connection's flood holds its own few slots: it cannot push
        another's first request out."""
        queue = self.parked.setdefault(ident, deque())
        queue.append(msg)
        if len(queue) > MAX_PARKED_PER_PEER:
            return queue.popleft()
        if len(self.parked) > MAX_PARKED:
            oldest = next(iter(self.parked))
            dropped = self.parked[oldest].popleft()
            if not self.parked[oldest]:
                del self.parked[oldest]
            return dropped
        return None

    def unpark(self) -> list[tuple[bytes, P.Message]]:
        """The parked requests, once the registry may be asked about them (else none): each
        connection's in the order they came."""
        if not self.parked or not self.may_ask():
            return []
        parked, self.parked = self.parked, OrderedDict()
        return [(ident, msg) for ident, queue in parked.items() for msg in queue]

    def may_ask(self) -> bool:
        """Whether the next ``identify`` of an unknown connection would ask STATUS."""
        return time.monotonic() >= self.next_status


def status_rows(ctx: zmq.Context, broker: str, keys: Any, roles: tuple[str, ...]) -> list[dict]:
    """The registry's STATUS rows of ``roles`` (each role's listing, page by page)."""
    rows: list[dict] = []
    for role in roles:
        reply = read_status(ctx, broker, STATUS_TIMEOUT_S, keys, role=role)
        rows += [r for r in reply["roles"] if isinstance(r, dict) and r.get("role") == role]
    return rows
