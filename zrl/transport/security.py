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
    run.secret                          the run secret: role credentials derive from it
                                        (``role_credential``); hosts that start roles
                                        need it, as the broker's host does

Identity: a key proves a peer may connect, not which role it is. Every HELLO carries a
credential, ``role_credential(secret, id)`` (an HMAC of the role id under the run secret),
which the registry checks against the id the HELLO claims: a process that holds the keys
but not the secret cannot take a role's id. ``zrl run`` gives each child only its own
credential (``ROLE_CREDENTIAL_ENV``) and the broker the secret (``RUN_SECRET_ENV``), with or
without keys.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
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
    run_secret: bytes | None = None
    """The run secret (``run.secret``); None in a key directory made before it existed."""

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
    write_run_secret(d / RUN_SECRET_FILE)
    for secret in d.glob("*.key_secret"):
        secret.chmod(0o600)
    # Secret keys must never reach a repository: the directory ignores itself.
    (d / ".gitignore").write_text("# zrl keys: secret, never commit them\n*\n")
    d.chmod(0o700)
    return d


RUN_SECRET_FILE = "run.secret"
RUN_SECRET_ENV = "ZRL_RUN_SECRET"
"""The broker's run secret, hex, in the environment ``zrl run`` gives its broker child."""
ROLE_CREDENTIAL_ENV = "ZRL_ROLE_CREDENTIAL"
"""A role's own credential, in the environment ``zrl run`` gives each role child."""
RUN_SECRET_BYTES = 32


def write_run_secret(path: Path) -> bytes:
    """A new run secret, written (hex, mode 0600) to ``path``."""
    secret = secrets.token_bytes(RUN_SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")
    return secret


def parse_run_secret(text: str, where: str) -> bytes:
    """The run secret in ``text`` (hex); ``KeysError`` naming ``where`` otherwise."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise KeysError(
            f"{where} holds no run secret (at least 32 hex digits); copy run.secret from "
            "the key directory `zrl keys init` made"
        )
    return secret


def role_credential(secret: bytes, role_id: str) -> str:
    """The credential that proves ``role_id`` (``<role>-<n>``; ``<role>-*`` for a role whose
    number the broker chooses): HMAC-SHA256 of the id under the run secret, hex."""
    return hmac.new(secret, role_id.encode(), hashlib.sha256).hexdigest()


def env_run_secret() -> bytes | None:
    """The run secret ``zrl run`` gave this process (its broker), or None."""
    text = os.environ.get(RUN_SECRET_ENV)
    return parse_run_secret(text, RUN_SECRET_ENV) if text else None


def hello_credential(keys: Keys | None, claimed: str) -> str | None:
    """What a role's HELLO proves ``claimed`` with: the credential its starter gave it
    (``ROLE_CREDENTIAL_ENV``), else one made from its keys' run secret, else None."""
    given = os.environ.get(ROLE_CREDENTIAL_ENV)
    if given:
        return given
    if keys is not None and keys.run_secret is not None:
        return role_credential(keys.run_secret, claimed)
    return None


def credential_matches(secret: bytes, role_id: str, credential: object) -> bool:
    """Whether ``credential`` proves ``role_id`` (constant-time)."""
    if not isinstance(credential, str) or len(credential) != 64:
        return False
    return hmac.compare_digest(role_credential(secret, role_id), credential)


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
    run_secret = None
    if (d / RUN_SECRET_FILE).is_file():
        run_secret = parse_run_secret((d / RUN_SECRET_FILE).read_text(), str(d / RUN_SECRET_FILE))
    return Keys(d, server_public, server_secret, client_public, client_secret, run_secret)


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
