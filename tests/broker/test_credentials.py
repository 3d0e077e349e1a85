"""Role credentials at the registry: a broker that holds the run secret registers an id only
for a HELLO that proves it (``zrl.transport.security.role_credential``), and a refused HELLO
changes nothing, a live entry under that id included. An in-process broker on inproc://;
HELLOs from raw DEALERs, as any process that reached the registry could send them."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zrl import __version__
from zrl.broker.broker import Broker
from zrl.config.experiment import ExperimentConfig
from zrl.roles.registry_client import read_status
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.security import (
    ROLE_CREDENTIAL_ENV,
    credential_matches,
    hello_credential,
    role_credential,
)
from zrl.transport.sockets import Channel, TransportStats, make_socket

SECRET = secrets.token_bytes(32)


@pytest.fixture
def broker() -> Iterator[tuple[zmq.Context, str, Broker]]:
    ctx = zmq.Context()
    addr = f"inproc://zrl-credentials-{os.getpid()}-{secrets.token_hex(4)}"
    b = Broker(addr, ExperimentConfig(), ctx=ctx, run_secret=SECRET)
    t = threading.Thread(target=b.run, name="broker", daemon=True)
    t.start()
    wait_for(lambda: bool(b.endpoints), timeout=10)
    try:
        yield ctx, addr, b
    finally:
        b.stop()
        t.join(10)
        ctx.destroy(linger=0)


def hello(ctx: zmq.Context, addr: str, **fields: Any) -> tuple[Channel, P.Message]:
    """One HELLO on a new connection, and the registry's reply."""
    sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=5000, sndtimeo_ms=1000)
    sock.connect(addr)
    ch = Channel(sock, "registry", "test", TransportStats())
    meta = {"role": "evaluator", "host": "h", "pid": 4242, "zrl_version": __version__, **fields}
    ch.send(P.Message(P.HELLO, meta=meta))
    got = ch.recv()
    assert got is not None, f"no reply to HELLO {meta}"
    return ch, got[1]


def rows(ctx: zmq.Context, addr: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in read_status(ctx, addr, 5.0)["roles"]}


def rejected(ctx: zmq.Context, addr: str) -> int:
    reasons = read_status(ctx, addr, 5.0)["broker"]["rejected"]
    return int(reasons.get("hello without a valid credential", 0))


def test_credential_is_an_hmac_of_the_id_under_the_secret() -> None:
    cred = role_credential(SECRET, "evaluator-0")
    assert credential_matches(SECRET, "evaluator-0", cred)
    assert not credential_matches(SECRET, "evaluator-1", cred)
    assert not credential_matches(secrets.token_bytes(32), "evaluator-0", cred)
    for bad in (None, 7, "", cred[:-1], cred.upper() + "0"):
        assert not credential_matches(SECRET, "evaluator-0", bad)


def test_a_role_proves_its_id_and_a_forger_changes_nothing(
    broker: tuple[zmq.Context, str, Broker],
) -> None:
    ctx, addr, _ = broker
    channels = []
    try:
        # No credential, a wrong one, or another role's: refused, nothing registered.
        for cred in (None, "0" * 64, role_credential(SECRET, "evaluator-1")):
            ch, reply = hello(ctx, addr, id="evaluator-0", credential=cred)
            channels.append(ch)
            assert reply.kind == P.REFUSED, reply.meta
        assert "evaluator-0" not in rows(ctx, addr)
        assert rejected(ctx, addr) == 3
        # The id's own credential: registered.
        real, reply = hello(
            ctx, addr, id="evaluator-0", credential=role_credential(SECRET, "evaluator-0")
        )
        channels.append(real)
        assert reply.kind == P.WELCOME and reply.meta["id"] == "evaluator-0"
        # A forger claiming the live id with the real pid and a wrong credential is refused
        # and the live entry keeps its connection: its heartbeat is acked.
        ch, reply = hello(ctx, addr, id="evaluator-0", pid=4242, credential="f" * 64)
        channels.append(ch)
        assert reply.kind == P.REFUSED
        real.send(P.Message(P.HEARTBEAT, meta={"id": "evaluator-0", "seq": 1}))
        got = real.recv()
        assert got is not None and got[1].kind == P.HEARTBEAT_ACK, got
        row = rows(ctx, addr)["evaluator-0"]
        assert (row["state"], row["pid"], row["restarts"]) == ("alive", 4242, 0)
        assert rejected(ctx, addr) == 4
    finally:
        for ch in channels:
            ch.close()


def test_a_numbered_role_proves_its_role_wildcard(
    broker: tuple[zmq.Context, str, Broker],
) -> None:
    """A HELLO without id or index (the registry numbers it) proves ``<role>-*``, which only
    the secret gives: a holder of one role's credential cannot take a numbered id."""
    ctx, addr, _ = broker
    channels = []
    try:
        ch, reply = hello(ctx, addr, role="actor", credential=role_credential(SECRET, "actor-0"))
        channels.append(ch)
        assert reply.kind == P.REFUSED
        ch, reply = hello(ctx, addr, role="actor", credential=role_credential(SECRET, "actor-*"))
        channels.append(ch)
        assert reply.kind == P.WELCOME and reply.meta["id"] == "actor-0"
    finally:
        for ch in channels:
            ch.close()


def test_hello_credential_prefers_what_the_starter_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROLE_CREDENTIAL_ENV, raising=False)
    assert hello_credential(None, "actor-0") is None
    monkeypatch.setenv(ROLE_CREDENTIAL_ENV, "ab" * 32)
    assert hello_credential(None, "actor-0") == "ab" * 32


def exited_pid() -> int:
    """The pid of a process that ran here and has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_restart_of_an_exited_process_takes_its_id_at_once(
    broker: tuple[zmq.Context, str, Broker],
) -> None:
    """With heartbeats from a thread, a live role is marked dead only after 10 s of silence;
    a role its parent restarted (its old process gone from the broker's host) need not wait
    for that: its proven HELLO takes the id over. A HELLO whose old process still runs waits."""
    ctx, addr, _ = broker
    host, cred = socket.gethostname(), role_credential(SECRET, "evaluator-0")
    channels = []
    try:
        ch, reply = hello(ctx, addr, id="evaluator-0", host=host, pid=os.getpid(), credential=cred)
        channels.append(ch)
        assert reply.kind == P.WELCOME
        # The old process (this one) still runs: a second proven HELLO gets no answer.
        sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=1000, sndtimeo_ms=1000)
        sock.connect(addr)
        other = Channel(sock, "registry", "test", TransportStats())
        channels.append(other)
        meta = {"role": "evaluator", "id": "evaluator-0", "host": host, "pid": exited_pid()}
        other.send(
            P.Message(P.HELLO, meta={**meta, "credential": cred, "zrl_version": __version__})
        )
        assert other.recv() is None
        # Registered by a process that has exited: its restart is welcome at once.
        gone = exited_pid()
        ch, reply = hello(
            ctx,
            addr,
            id="evaluator-1",
            host=host,
            pid=gone,
            credential=role_credential(SECRET, "evaluator-1"),
        )
        channels.append(ch)
        assert reply.kind == P.WELCOME
        ch, reply = hello(
            ctx,
            addr,
            id="evaluator-1",
            host=host,
            pid=os.getpid(),
            credential=role_credential(SECRET, "evaluator-1"),
        )
        channels.append(ch)
        assert reply.kind == P.WELCOME and reply.meta["id"] == "evaluator-1"
        row = rows(ctx, addr)["evaluator-1"]
        assert (row["pid"], row["restarts"]) == (os.getpid(), 1)
    finally:
        for ch in channels:
            ch.close()
