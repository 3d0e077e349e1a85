"""The learner group's rendezvous store (``zrl.distributed.learner_group``): rank 0 holds a bounded
table of keys and values and serves it to the other ranks over one ZeroMQ ROUTER bound to the
run's address (the address rank 0 advertises: loopback in a one-host run), never every
interface. Every request and every reply carries an HMAC-SHA256 under a key rank 0 makes at
random for its store and shows only in its heartbeat, next to the store's address (the
*ticket*, ``host:port#key``), so only a process that asked the broker for learner 0's row
(with ``--keys``: a holder of an authorized key) can read or write the table. A request
without a valid HMAC, replayed (each client numbers its requests) or malformed is dropped
unanswered and counted (``rejected``); an authenticated one the table refuses (a key outside
``zrl/``, a value too large, a generation that is no number or goes back, the table past its
bound) is answered with an error and counted (``refused``).

Both ends are ``torch.distributed.Store`` subclasses: :class:`LocalStore` (rank 0, the table
itself) and :class:`RemoteStore` (the other ranks, one DEALER to rank 0's ROUTER), so the
process group (gloo, nccl) makes its own connections through them as through a TCPStore.
torch's ``TCPStore`` is not used: it listens on every interface whatever host it is given,
authenticates nobody, lists its keys to any client (``list_keys``) and keeps whatever it is
sent, so anyone who reaches its port could claim a rank or fill rank 0's memory.

The table's bound: ``MAX_KEYS`` keys, ``MAX_TABLE_BYTES`` of keys and values, values of at
most ``MAX_VALUE_BYTES``; once the generation moves on (``GENERATION_KEY``), the keys of
generations before the previous one (``zrl/gen/<g>/...``) are deleted.

Sockets: the ROUTER (rank 0, the run's address, a random port; read by a thread of its own,
``zrl-group-store``) and one DEALER per other rank connected to it. Authenticated, not
encrypted: the values (the generation, the ranks' keys, the backend's addresses) travel in
the clear; the key itself never goes over this socket.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import secrets
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

import msgpack
import torch.distributed as dist
import zmq

from zrl.transport.sockets import make_socket

GENERATION_KEY = "zrl/generation"  # the store's current rendezvous generation (1, 2, ...)
KEY_ROOT = "zrl/"  # every key of the table is under it
KEY_BYTES = 16  # the store's HMAC key (random, per store)
MAX_GENERATION = 2**62
MAX_KEY_CHARS = 256
MAX_VALUE_BYTES = 1 << 20  # gloo's address record of one rank: ~100 bytes per peer
MAX_KEYS = 16384
MAX_TABLE_BYTES = 64 << 20
MAX_CHECK_KEYS = 4096  # keys one ``check`` asks about
MAX_REQUEST_BYTES = MAX_VALUE_BYTES + 64 * 1024  # MAXMSGSIZE of the ROUTER's frames
MAX_CLIENTS = 1024  # clients whose request numbers the server remembers (oldest forgotten)
REQUEST_S = 5.0  # one request's reply: past it the store is taken for gone
SERVE_POLL_MS = 100
WAIT_FIRST_S, WAIT_MAX_S = 0.002, 0.05  # a get or wait on a key not set yet polls so


class StoreRefused(RuntimeError):
    """The store refused a request: an invalid key or value, or the table past its bound. A
    ``RuntimeError``, as torch's stores raise, so the rendezvous treats it as a failed store."""


class StoreUnreachable(RuntimeError):
    """Rank 0's store did not answer a request in time (gone, or the wrong key)."""


def generation_value(raw: bytes | str | None) -> int | None:
    """The generation a stored value holds: a decimal number in ``[1, MAX_GENERATION]``;
    None for anything else (absent, not a number, out of range)."""
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes) or not 0 < len(raw) <= 19 or not raw.isdigit():
        return None
    value = int(raw)
    return value if value <= MAX_GENERATION and value >= 1 else None


def generation_of(key: str) -> int | None:
    """The generation a ``zrl/gen/<g>/...`` key belongs to (None for other keys)."""
    parts = key.split("/", 3)
    if len(parts) < 3 or parts[:2] != ["zrl", "gen"]:
        return None
    return generation_value(parts[2])


def as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def bind_address(host: str) -> str:
    """The IP address of ``host`` (an address or a name of this host) to bind: IPv4 first.
    ``OSError`` where it does not resolve."""
    host = host.strip("[]")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            infos = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
        except OSError:
            continue
        if infos:
            return str(infos[0][4][0])
    raise OSError(f"{host!r} does not resolve to an address")


def tcp_url(host: str) -> str:
    """``tcp://host`` (an IPv6 address in brackets), to bind or, with ``:port``, connect."""
    host = host.strip("[]")
    return f"tcp://[{host}]" if ":" in host else f"tcp://{host}"


def parse_ticket(ticket: str) -> tuple[str, int, bytes]:
    """``host:port#key`` (what rank 0 shows) as ``(host, port, key)``; ValueError otherwise."""
    address, sep, key_hex = ticket.rpartition("#")
    host, _, port = address.rpartition(":")
    key = bytes.fromhex(key_hex) if sep else b""
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or len(key) != KEY_BYTES:
        raise ValueError(f"not a group store ticket (host:port#key): {ticket[:80]!r}")
    return host.strip("[]"), int(port), key


def endpoint_of(ticket: str | None) -> str | None:
    """A ticket without its key: what logs and errors may show."""
    return ticket.partition("#")[0] if ticket is not None else None


def seal(key: bytes, kind: bytes, body: bytes) -> bytes:
    return hmac.new(key, kind + body, hashlib.sha256).digest()


class Table:
    """The store's keys and values (rank 0), bounded; shared by the server's thread and rank
    0's own :class:`LocalStore` under one condition."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.size = 0  # bytes of keys and values
        self.cond = threading.Condition()
        self.refused = 0
        """Requests refused: an invalid key or value, or past the bound."""

    def refuse(self, why: str) -> StoreRefused:
        self.refused += 1
        return StoreRefused(f"learner group store: {why}")

    def checked_key(self, key: Any) -> str:
        if (
            not isinstance(key, str)
            or not key.startswith(KEY_ROOT)
            or len(key) > MAX_KEY_CHARS
            or not (key.isascii() and key.isprintable())
        ):
            raise self.refuse(
                f"key {str(key)[:64]!r} refused (a printable ASCII zrl/ key, at most "
                f"{MAX_KEY_CHARS} characters)"
            )
        return key

    def checked_value(self, key: str, value: Any, stored: bool = True) -> bytes:
        """``value`` as bytes, within ``MAX_VALUE_BYTES``; where it is to be ``stored`` under
        ``GENERATION_KEY``, a generation not below the current one."""
        if not isinstance(value, bytes | str):
            raise self.refuse(f"{key}: a value of type {type(value).__name__} refused")
        value = as_bytes(value)
        if len(value) > MAX_VALUE_BYTES:
            raise self.refuse(f"{key}: a value of {len(value)} bytes (at most {MAX_VALUE_BYTES})")
        if stored and key == GENERATION_KEY:
            new = generation_value(value)
            if new is None:
                raise self.refuse(f"{key}: {value[:32]!r} is no generation (1 to 2**62)")
            old = generation_value(self.data.get(key)) or 0
            if new < old:
                raise self.refuse(f"{key}: {new} would go back from {old}")
        return value

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` (checked) under ``key``, within the bound; the caller holds cond."""
        old = self.data.get(key)
        grow = len(value) - len(old) if old is not None else len(key) + len(value)
        if old is None and len(self.data) >= MAX_KEYS:
            raise self.refuse(f"{key}: the store holds {MAX_KEYS} keys already")
        if self.size + grow > MAX_TABLE_BYTES:
            raise self.refuse(f"{key}: the store would pass {MAX_TABLE_BYTES} bytes")
        self.data[key] = value
        self.size += grow
        if key == GENERATION_KEY:
            self.prune(generation_value(value) or 0)
        self.cond.notify_all()

    def prune(self, generation: int) -> None:
        """Delete the keys of generations before ``generation - 1``."""
        for key in list(self.data):
            of = generation_of(key)
            if of is not None and of < generation - 1:
                self.size -= len(key) + len(self.data.pop(key))

    def set(self, key: Any, value: Any) -> None:
        with self.cond:
            key = self.checked_key(key)
            self.put(key, self.checked_value(key, value))

    def get(self, key: Any) -> bytes | None:
        with self.cond:
            return self.data.get(self.checked_key(key))

    def check(self, keys: Any) -> bool:
        if not isinstance(keys, list) or len(keys) > MAX_CHECK_KEYS:
            raise self.refuse(f"check of {type(keys).__name__} refused")
        with self.cond:
            return all(self.checked_key(k) in self.data for k in keys)

    def compare_set(self, key: Any, expected: Any, desired: Any) -> bytes:
        """torch's ``compare_set``: ``desired`` where the value is ``expected`` (or absent,
        with ``expected`` empty); returns the value now stored (``expected`` where absent)."""
        with self.cond:
            key = self.checked_key(key)
            expected = self.checked_value(key, expected, stored=False)
            current = self.data.get(key)
            if current is None and expected != b"":
                return expected
            if current is None or current == expected:
                desired = self.checked_value(key, desired)
                self.put(key, desired)
                return desired
            return current

    def add(self, key: Any, amount: Any) -> int:
        if not isinstance(amount, int) or abs(amount) > MAX_GENERATION:
            raise self.refuse("add of an amount that is no integer")
        with self.cond:
            key = self.checked_key(key)
            raw = self.data.get(key, b"0")
            try:
                value = int(raw) + amount
            except ValueError:
                raise self.refuse(f"add to {key}, which holds no integer") from None
            self.put(key, self.checked_value(key, str(value)))
            return value

    def delete(self, key: Any) -> bool:
        with self.cond:
            key = self.checked_key(key)
            old = self.data.pop(key, None)
            if old is None:
                return False
            self.size -= len(key) + len(old)
            return True

    def num_keys(self) -> int:
        with self.cond:
            return len(self.data)

    def wait_for(self, keys: list[str], timeout_s: float) -> bool:
        """Whether every key of ``keys`` is set within ``timeout_s``."""
        with self.cond:
            return self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout_s)


OPS = ("set", "get", "check", "compare_set", "add", "delete", "num_keys")


class StoreServer:
    """Rank 0's store: the :class:`Table`, served on a ROUTER bound to ``host`` (an IP
    address, a random port) by a daemon thread, every request authenticated under ``key``."""

    def __init__(self, host: str, key: bytes, log: logging.Logger | None = None) -> None:
        self.table = Table()
        self.key = key
        self.log = log or logging.getLogger("zrl.learner_group")
        self.rejected = 0
        """Requests dropped unanswered: no valid HMAC, replayed or malformed."""
        self.clients: OrderedDict[bytes, int] = OrderedDict()  # a client's last request number
        self.stopping = threading.Event()
        sock = make_socket(
            zmq.Context.instance(),
            zmq.ROUTER,
            sndhwm=16,
            rcvhwm=16,
            max_message_bytes=MAX_REQUEST_BYTES,
            rcvtimeo_ms=0,
            sndtimeo_ms=0,
        )
        try:
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            self.port = sock.bind_to_random_port(tcp_url(host))
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self.sock = sock
        self.thread = threading.Thread(target=self.serve, name="zrl-group-store", daemon=True)
        self.thread.start()

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self.stopping.is_set():
                if not poller.poll(SERVE_POLL_MS):
                    continue
                for _ in range(64):
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    reply = self.handle(frames)
                    if reply is not None:
                        try:
                            self.sock.send_multipart(reply, zmq.NOBLOCK)
                        except zmq.ZMQError:
                            pass  # the client's queue is full or it left: it asks again
        except zmq.ZMQError as exc:  # the context ended under us (the process exits)
            self.log.debug("learner group store: %s", exc)
        finally:
            self.sock.close(linger=0)

    def handle(self, frames: list[bytes]) -> list[bytes] | None:
        """The reply to one request (``[routing id, body, hmac]``), or None where it is
        dropped (counted in ``rejected``)."""
        if len(frames) != 3 or not hmac.compare_digest(
            seal(self.key, b"req", frames[1]), frames[2]
        ):
            self.rejected += 1
            return None
        try:
            client, number, op, args = msgpack.unpackb(frames[1], raw=False)
            if not isinstance(client, bytes) or not isinstance(number, int) or op not in OPS:
                raise ValueError("not a request")
            if not isinstance(args, list):
                raise ValueError("not a request")
        except (ValueError, TypeError, msgpack.UnpackException):
            self.rejected += 1
            return None
        if number <= self.clients.get(client, 0):
            self.rejected += 1  # replayed (or a stale duplicate)
            return None
        self.clients[client] = number
        self.clients.move_to_end(client)
        while len(self.clients) > MAX_CLIENTS:
            self.clients.popitem(last=False)
        try:
            result, error = getattr(self.table, op)(*args), None
        except StoreRefused as exc:
            result, error = None, str(exc)
        except TypeError:  # the wrong number of arguments
            self.table.refused += 1
            result, error = None, f"learner group store: {op} with {len(args)} arguments"
        body = msgpack.packb([client, number, error, result], use_bin_type=True)
        return [frames[0], body, seal(self.key, b"rep", body)]

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5 * SERVE_POLL_MS / 1000)


def wait_deadline(timeout: datetime.timedelta | float | None, default_s: float) -> float:
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    return time.monotonic() + (seconds if seconds else default_s)


class LocalStore(dist.Store):
    """Rank 0's ``torch.distributed.Store``: its table, without a socket."""

    def __init__(self, table: Table, timeout_s: float) -> None:
        super().__init__()
        self.table = table
        self.timeout_s = timeout_s

    def set(self, key: str, value: bytes | str) -> None:
        self.table.set(key, value)

    def get(self, key: str) -> bytes:
        value = self.table.get(key) if self.table.wait_for([key], self.timeout_s) else None
        if value is None:
            raise StoreUnreachable(
                f"learner group store: {key} not set within {self.timeout_s:g} s"
            )
        return value

    def check(self, keys: list[str]) -> bool:
        return self.table.check(list(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        left = wait_deadline(timeout, self.timeout_s) - time.monotonic()
        if not self.table.wait_for(list(keys), max(0.0, left)):
            raise StoreUnreachable(f"learner group store: {keys} not set in time")

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self.table.compare_set(key, as_bytes(expected), as_bytes(desired))

    def add(self, key: str, value: int) -> int:
        return self.table.add(key, int(value))

    def delete_key(self, key: str) -> bool:
        return self.table.delete(key)

    def num_keys(self) -> int:
        return self.table.num_keys()


class RemoteStore(dist.Store):
    """A rank's ``torch.distributed.Store`` on rank 0's table: one DEALER to its server,
    every request sealed under ``key``. A get or wait on a key not set yet asks again (every
    ``WAIT_FIRST_S`` to ``WAIT_MAX_S``) until ``timeout_s``; a request unanswered in
    ``REQUEST_S`` raises :class:`StoreUnreachable`, one refused :class:`StoreRefused`. Safe
    to use from several threads (the backend's own)."""

    def __init__(self, host: str, port: int, key: bytes, timeout_s: float) -> None:
        super().__init__()
        self.key = key
        self.where = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.client = secrets.token_bytes(8)
        self.number = 0
        self.lock = threading.Lock()
        sock = make_socket(
            zmq.Context.instance(),
            zmq.DEALER,
            sndhwm=16,
            rcvhwm=16,
            max_message_bytes=MAX_REQUEST_BYTES,
            rcvtimeo_ms=0,
            sndtimeo_ms=0,
        )
        if ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(f"{tcp_url(host)}:{port}")
        self.sock: zmq.Socket | None = sock

    def request(self, op: str, *args: Any, timeout_s: float = REQUEST_S) -> Any:
        """One request to the server and its result (``StoreRefused``: its error)."""
        with self.lock:
            sock = self.sock
            if sock is None:
                raise StoreUnreachable(f"learner group store at {self.where}: closed")
            self.number += 1
            number = self.number
            body = msgpack.packb([self.client, number, op, list(args)], use_bin_type=True)
            try:
                sock.send_multipart([body, seal(self.key, b"req", body)], zmq.NOBLOCK)
            except zmq.Again:
                raise StoreUnreachable(
                    f"learner group store at {self.where}: not connected"
                ) from None
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
                    continue
                frames = sock.recv_multipart()
                reply = self.opened(frames)
                if reply is None or reply[1] != number:
                    continue  # a late reply to an earlier request, or not the server's
                if reply[2] is not None:
                    raise StoreRefused(str(reply[2]))
                return reply[3]
            raise StoreUnreachable(
                f"learner group store at {self.where}: no answer within {timeout_s:g} s"
            )

    def opened(self, frames: list[bytes]) -> list[Any] | None:
        """A reply's ``[client, number, error, result]`` where it is the server's, to us."""
        if len(frames) != 2 or not hmac.compare_digest(
            seal(self.key, b"rep", frames[0]), frames[1]
        ):
            return None
        try:
            reply = msgpack.unpackb(frames[0], raw=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            return None
        if not isinstance(reply, list) or len(reply) != 4 or reply[0] != self.client:
            return None
        return reply

    def waiting(self, ready: Any, deadline: float, what: str) -> Any:
        """Ask ``ready()`` until it gives something other than None or False."""
        pause = WAIT_FIRST_S
        while True:
            value = ready()
            if value is not None and value is not False:
                return value
            if time.monotonic() >= deadline:
                raise StoreUnreachable(
                    f"learner group store at {self.where}: {what} not set in time"
                )
            time.sleep(pause)
            pause = min(2 * pause, WAIT_MAX_S)

    def ping(self, timeout_s: float) -> None:
        """One request answered within ``timeout_s``, or StoreUnreachable."""
        self.request("num_keys", timeout_s=timeout_s)

    def set(self, key: str, value: bytes | str) -> None:
        self.request("set", key, as_bytes(value))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        value = self.waiting(lambda: self.request("get", key), deadline, key)
        if not isinstance(value, bytes):
            raise StoreRefused(f"learner group store at {self.where}: {key} is no bytes")
        return value

    def check(self, keys: list[str]) -> bool:
        return bool(self.request("check", list(keys)))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        deadline = wait_deadline(timeout, self.timeout_s)
        self.waiting(lambda: self.request("check", list(keys)), deadline, str(keys))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        value = self.request("compare_set", key, as_bytes(expected), as_bytes(desired))
        if not isinstance(value, bytes):
            raise StoreRefused(f"learner group store at {self.where}: {key} is no bytes")
        return value

    def add(self, key: str, value: int) -> int:
        result = self.request("add", key, int(value))
        if not isinstance(result, int):
            raise StoreRefused(f"learner group store at {self.where}: {key} is no integer")
        return result

    def delete_key(self, key: str) -> bool:
        return bool(self.request("delete", key))

    def num_keys(self) -> int:
        result = self.request("num_keys")
        return result if isinstance(result, int) else 0

    def close(self) -> None:
        with self.lock:
            if self.sock is not None:
                self.sock.close(linger=0)
            self.sock = None
