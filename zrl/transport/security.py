"""CurveZMQ authentication and encryption for every zrl socket.

Threat model: the broker's address is reachable by anyone on the network. Without
keys, anyone who can reach it can register a role, publish weights, push
experience, read every stream and, through pickled factories, run code in our
roles. With a key directory (``zrl keys init DIR``) every socket of every role and of
the broker speaks CURVE: traffic is encrypted, and a binding socket accepts only
clients whose public key is in ``DIR/authorized/`` (checked by pyzmq's ZAP
authenticator, one per process). Copy DIR to each host you trust; a host without
an authorized client key can neither connect nor decrypt anything.

Layout of DIR::

    server.key / server.key_secret      keypair of every binding socket (broker, params rpc);
                                        hosts that bind nothing need only server.key
    client.key / client.key_secret      keypair roles connect with (`--key-name` picks
                                        another one, e.g. made by `zrl keys add DIR host7`)
    authorized/<name>.key               public keys allowed to connect
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


class KeysError(ValueError):
    """A key directory that is missing or incomplete; user-facing."""


@dataclass(frozen=True)
class Keys:
    directory: Path
    server_public: bytes
    server_secret: bytes | None  # only hosts that bind (broker, params) need it
    client_public: bytes
    client_secret: bytes

    @property
    def authorized_dir(self) -> Path:
        return self.directory / "authorized"


def init_keys(directory: str | Path, *, force: bool = False) -> Path:
    """Create a server keypair, a client keypair and an allow-list holding the client."""
    d = Path(directory)
    if (d / "server.key_secret").exists() and not force:
        raise KeysError(f"{d} already holds keys (use --force to replace them)")
    d.mkdir(parents=True, exist_ok=True)
    (d / "authorized").mkdir(exist_ok=True)
    zmq.auth.create_certificates(d, "server")
    zmq.auth.create_certificates(d, "client")
    shutil.copy(d / "client.key", d / "authorized" / "client.key")
    for secret in d.glob("*.key_secret"):
        secret.chmod(0o600)
    return d


def add_client(directory: str | Path, name: str) -> Path:
    """A further client keypair (e.g. one per host), authorized at once."""
    d = Path(directory)
    if not (d / "authorized").is_dir():
        raise KeysError(f"{d} is not a zrl key directory (run `zrl keys init {d}` first)")
    pub, secret = zmq.auth.create_certificates(d, name)
    Path(secret).chmod(0o600)
    shutil.copy(pub, d / "authorized" / f"{name}.key")
    return Path(secret)


def load_keys(directory: str | Path, client: str = "client") -> Keys:
    """The keys of one host: the server's public key (its secret only where present: hosts
    that run no broker or rpc server need not hold it) and the named client keypair."""
    d = Path(directory)
    needed = [d / "server.key", d / f"{client}.key_secret"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise KeysError(
            f"key directory {d} lacks {', '.join(missing)} (make one with `zrl keys init`)"
        )
    server_public, _ = zmq.auth.load_certificate(d / "server.key")
    server_secret = None
    if (d / "server.key_secret").is_file():
        _, server_secret = zmq.auth.load_certificate(d / "server.key_secret")
    client_public, client_secret = zmq.auth.load_certificate(d / f"{client}.key_secret")
    if client_secret is None:
        raise KeysError(f"{d / (client + '.key_secret')} holds no secret key")
    if not (d / "authorized").is_dir():
        raise KeysError(f"{d} has no authorized/ directory")
    return Keys(d, server_public, server_secret, client_public, client_secret)


def secure_server(sock: zmq.Socket, keys: Keys) -> None:
    """Make a binding socket a CURVE server (clients are checked by the authenticator)."""
    if keys.server_secret is None:
        raise KeysError(
            f"{keys.directory} has no server.key_secret: this host cannot serve authenticated "
            "sockets (copy server.key_secret to the hosts that run the broker or params)"
        )
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True


def secure_client(sock: zmq.Socket, keys: Keys) -> None:
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public


_authenticators: dict[int, ThreadAuthenticator] = {}
_auth_lock = threading.Lock()


def ensure_authenticator(ctx: zmq.Context, keys: Keys) -> None:
    """Start (once per context) the ZAP handler that enforces the allow-list.

    Without it libzmq would accept any client that merely knows the server's public key."""
    with _auth_lock:
        if id(ctx) in _authenticators:
            return
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(keys.authorized_dir))
        _authenticators[id(ctx)] = auth


def stop_authenticator(ctx: zmq.Context) -> None:
    with _auth_lock:
        auth = _authenticators.pop(id(ctx), None)
    if auth is not None:
        auth.stop()
