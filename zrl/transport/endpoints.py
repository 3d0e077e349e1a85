"""Where a broker's sockets are, and how a role reaches them: the endpoint layout derived from
the broker's base address, the ipc:// twins of a tcp broker's endpoints for roles on its
machine, and tcp address helpers (loopback, the address to connect to, free port ranges).

Sockets: none (``connect_topics`` connects a socket it is given).
"""

from __future__ import annotations

import os
import random
import socket
import stat
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import zmq

# --- endpoint layout ----------------------------------------------------------------


def broker_endpoints(base: str, streams: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Every address the broker binds, derived from its base address.

    tcp://H:P -> registry P, topics in P+1 / out P+2, stream i in P+3+2i / out P+4+2i, and
    after the streams the topic bus's bulk lane (``topics_bulk_out``).
    inproc:// and ipc:// -> the base name with a suffix per socket."""
    names = ["registry", "topics_in", "topics_out"]
    for s in streams:
        names += [f"{s}_in", f"{s}_out"]
    names.append("topics_bulk_out")
    if base.startswith("tcp://"):
        host, port = split_tcp(base)
        return {name: f"tcp://{host}:{port + i}" for i, name in enumerate(names)}
    if base.startswith(("inproc://", "ipc://")):
        return {name: base if i == 0 else f"{base}-{name}" for i, name in enumerate(names)}
    raise ValueError(
        f"unsupported broker address {base!r}: use tcp://HOST:PORT, ipc:// or inproc://"
    )


# --- ipc:// beside tcp:// for roles on the broker's host ----------------------------------
# A tcp broker also binds every endpoint on ipc:// in a private directory named after its
# uid and port, so a restarted broker binds the same paths and connected roles reconnect.

IPC_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes with its NUL on Linux, 104 on macOS
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


NET_NAMESPACE = "/proc/self/ns/net"


def host_identity() -> dict[str, str]:
    """This machine's hostname, boot id and network namespace (empty where the kernel has
    none): two processes with the same three run under one kernel in one network, so ipc://
    between them may work. The namespace keeps roles that a test (or a container) put in a
    network of their own on the network, where they were placed to be."""
    try:
        with open(BOOT_ID_FILE) as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = ""
    try:
        netns = str(os.stat(NET_NAMESPACE).st_ino)
    except OSError:
        netns = ""
    return {"hostname": socket.gethostname(), "boot_id": boot_id, "netns": netns}


def ipc_dir_name(port: int) -> str:
    return f"zrl-ipc-{os.getuid()}-{port}"


def is_private_dir(path: str | os.PathLike[str]) -> bool:
    """A real directory (not a link) owned by this uid that no one else may enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ipc_broker_endpoints(
    tcp_base: str, streams: list[str] | tuple[str, ...], directory: str | None = None
) -> dict[str, str] | None:
    """The ipc:// twins of a tcp broker's endpoints, in ``directory`` (default: the temp
    directory's ``zrl-ipc-<uid>-<port>``); None when a path would be too long for a unix
    socket."""
    _, port = split_tcp(tcp_base)
    directory = directory or os.path.join(tempfile.gettempdir(), ipc_dir_name(port))
    eps = broker_endpoints(f"ipc://{directory}/b", streams)
    if max(len(os.fsencode(a[len("ipc://") :])) for a in eps.values()) > IPC_SOCKET_PATH_MAX:
        return None
    return eps


def usable_ipc_endpoints(ipc: Any, host: Any, broker: str, names: Any) -> dict[str, str] | None:
    """The ipc endpoints a WELCOME offers, if this role may use them instead of tcp:
    the broker runs under this kernel in this network namespace (same hostname, boot id and
    namespace) and is reached over tcp,
    every name is there, and every address is a unix socket that exists in this uid's
    private ``zrl-ipc-<uid>-<broker port>`` directory. Containers share the boot id but not
    /tmp; a forged WELCOME cannot point a role at another user's socket. Else None (tcp)."""
    if not broker.startswith("tcp://") or not isinstance(ipc, dict) or not ipc:
        return None
    if not isinstance(host, dict) or host != host_identity():
        return None
    if set(ipc) != set(names):
        return None
    _, port = split_tcp(broker)
    dirs = set()
    for addr in ipc.values():
        if not isinstance(addr, str) or not addr.startswith("ipc://"):
            return None
        path = addr[len("ipc://") :]
        dirs.add(os.path.dirname(path))
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    if len(dirs) != 1:
        return None
    (d,) = dirs
    if os.path.basename(d) != ipc_dir_name(port) or not is_private_dir(d):
        return None
    return dict(ipc)


def connect_topics(sock: zmq.Socket, endpoints: dict[str, str]) -> None:
    """Connect a SUB to both lanes of the broker's topic bus (small and bulk messages)."""
    sock.connect(endpoints["topics_out"])
    if "topics_bulk_out" in endpoints:
        sock.connect(endpoints["topics_bulk_out"])


def split_tcp(addr: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(addr)
    if parsed.scheme != "tcp" or not parsed.hostname or parsed.port is None:
        raise ValueError(f"{addr!r} is not tcp://HOST:PORT")
    host = parsed.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return host, parsed.port


def connect_address(bound: str, broker: str) -> str:
    """The address to connect to for a broker socket bound at ``bound`` when the broker
    was reached at ``broker``: a wildcard bind is replaced by the broker's host."""
    if bound.startswith("tcp://") and broker.startswith("tcp://"):
        _, port = split_tcp(bound)
        host, _ = split_tcp(broker)
        return f"tcp://{host}:{port}"
    return bound


def is_loopback(addr: str) -> bool:
    if not addr.startswith("tcp://"):
        return True
    host, _ = split_tcp(addr)
    host = host.strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes the local ports of outgoing connections from (Linux's
    default where it cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port_range(
    count: int, host: str = "127.0.0.1", start: int = 20000, end: int = 60000
) -> int:
    """A base port P with P..P+count-1 all free right now (random start, linear probe),
    outside the ephemeral range where the ports between ``start`` and ``end`` allow: a port
    free now there may become the local end of any outgoing connection before it is bound."""
    low, high = ephemeral_ports()
    # Bases whose range misses [low, high]: below it, then above it.
    spans = [(start, min(end, low) - count), (max(start, high + 1), end - count)]
    spans = [(a, b) for a, b in spans if b > a] or [(start, end - count)]
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    for _ in range(200):
        a, b = rng.choice(spans)
        base = rng.randrange(a, b)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no range of {count} free ports on {host}")
