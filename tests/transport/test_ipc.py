"""ipc:// beside tcp://: a tcp broker also binds its endpoints on ipc://, and a role on the
broker's machine connects there (``broker.ipc``); roles elsewhere, and forged offers, get tcp.

Brokers run in-process (own context, a thread); every broker and role is stopped in a
``finally``/fixture teardown."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zrl.broker.broker import Broker
from zrl.config.experiment import ExperimentConfig
from zrl.roles.base import Role
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.endpoints import (
    host_identity,
    ipc_broker_endpoints,
    ipc_dir_name,
    split_tcp,
    usable_ipc_endpoints,
)
from zrl.transport.security import init_keys, load_keys


class PlainRole(Role):
    role = "ipctest"


@pytest.fixture
def tcp_broker(broker_addr: str) -> Iterator[Any]:
    """Start an in-process tcp broker (own context) with broker.* settings."""
    made: list[tuple[Broker, threading.Thread]] = []

    def make(keys: Any = None, **settings: Any) -> Broker:
        cfg = ExperimentConfig()
        for key, value in settings.items():
            setattr(cfg.broker, key, value)
        b = Broker(broker_addr, cfg, keys=keys)
        t = threading.Thread(target=b.run, daemon=True)
        t.start()
        made.append((b, t))
        return b

    yield make
    for b, t in made:
        b.stop()
        t.join(5)


def roundtrip(role: Role) -> np.ndarray:
    """Push one array through the broker's experience stream and pull it back."""
    push, pull = role.open_push("experience"), role.open_pull("experience")
    arr = np.arange(300_000, dtype=np.uint8)
    for _ in range(50):  # the PULL's connection may not be up yet
        assert push.send(P.Message(P.TRAJECTORY, arrays={"obs": arr}))
        got = pull.recv()
        if got is not None:
            np.testing.assert_array_equal(got[1].arrays["obs"], arr)
            return got[1].arrays["obs"]
    raise AssertionError("nothing came through the experience stream")


def registered(broker: Broker, keys: Any = None) -> Role:
    role = PlainRole(broker.bind_address, index=0, connect_timeout=10, keys=keys)
    role.connect()
    return role


def test_a_role_on_the_broker_host_connects_over_ipc(tcp_broker):
    b = tcp_broker()
    assert b.ipc_endpoints and set(b.ipc_endpoints) == set(b.endpoints)
    d = Path(b.ipc_endpoints["registry"][len("ipc://") :]).parent
    assert d.name == ipc_dir_name(split_tcp(b.bind_address)[1])
    assert d.stat().st_mode & 0o777 == 0o700
    role = registered(b)
    try:
        assert role.transport == "ipc"
        assert role.endpoints == b.ipc_endpoints
        roundtrip(role)
        sub = role.open_subscriber(["hello/"])  # the topic bus works over ipc too
        pub = role.open_publisher()
        for _ in range(50):
            pub.send(P.Message(P.METRICS, meta={"x": 1}), topic="hello/x", block=False)
            if sub.recv() is not None:
                break
        else:
            raise AssertionError("no topic message over ipc")
    finally:
        role.close()
    b.stop()  # run() closes the broker, which removes its ipc directory
    wait_for(lambda: not d.exists(), timeout=5)


def test_broker_ipc_false_gives_tcp(tcp_broker):
    b = tcp_broker(ipc=False)
    assert b.ipc_endpoints == {}
    role = registered(b)
    try:
        assert role.transport == "tcp"
        assert all(a.startswith("tcp://") for a in role.endpoints.values())
        roundtrip(role)
    finally:
        role.close()


def test_ipc_keeps_curve(tcp_broker, tmp_path):
    """The ipc endpoints are further bindings of the CURVE server sockets: a client without
    the keys gets nothing through them, a client with them does."""
    keys = load_keys(init_keys(tmp_path / "keys"))
    b = tcp_broker(keys=keys)
    role = registered(b, keys=keys)
    try:
        assert role.transport == "ipc"
        plain = PlainRole(b.bind_address, index=1, connect_timeout=10)
        plain.config, plain.endpoints, plain.id = role.config, dict(role.endpoints), "intruder"
        push = plain.open_push("experience", sndtimeo_ms=300)
        try:
            for i in range(3):  # queued locally; the handshake never completes
                push.send(P.Message(P.TRAJECTORY, meta={"n": i}))
            pull = role.open_pull("experience")
            mine = role.open_push("experience")
            senders = []
            for _ in range(10):
                mine.send(P.Message(P.TRAJECTORY, meta={"n": -1}))
                got = pull.recv()
                if got is not None:
                    senders.append(got[1].sender)
            assert senders and "intruder" not in senders  # the only PULL got only ours
        finally:
            plain.close()
    finally:
        role.close()


def test_the_inproc_broker_offers_no_ipc(zmq_ctx):
    b = Broker(f"inproc://zrl-ipc-test-{os.getpid()}", ExperimentConfig(), ctx=zmq_ctx)
    try:
        assert b.ipc_endpoints == {}
        assert b._welcome("x").meta["ipc_endpoints"] == {}
    finally:
        b.close()


def test_forged_or_foreign_ipc_offers_are_refused(tcp_broker, tmp_path):
    b = tcp_broker()
    ipc, host, names = b.ipc_endpoints, host_identity(), b.endpoints
    assert usable_ipc_endpoints(ipc, host, b.bind_address, names) == ipc
    other_boot = {**host, "boot_id": "another-kernel"}
    assert usable_ipc_endpoints(ipc, other_boot, b.bind_address, names) is None
    assert (
        usable_ipc_endpoints(ipc, {**host, "hostname": "elsewhere"}, b.bind_address, names) is None
    )
    # A role in another network namespace (a test's "host", a container) stays on tcp.
    assert usable_ipc_endpoints(ipc, {**host, "netns": "1"}, b.bind_address, names) is None
    assert usable_ipc_endpoints(ipc, host, "inproc://x", names) is None
    assert usable_ipc_endpoints({}, host, b.bind_address, names) is None
    missing = dict(ipc)
    missing.pop("experience_in")
    assert usable_ipc_endpoints(missing, host, b.bind_address, names) is None
    # Sockets outside the broker port's private directory (another port, another place).
    host_port = b.bind_address.rsplit(":", 1)[0]
    assert usable_ipc_endpoints(ipc, host, f"{host_port}:1", names) is None
    elsewhere = ipc_broker_endpoints(b.bind_address, b.streams, str(tmp_path))
    assert elsewhere is not None
    assert usable_ipc_endpoints(elsewhere, host, b.bind_address, names) is None
    # A directory of the right name that others may enter.
    d = tmp_path / ipc_dir_name(split_tcp(b.bind_address)[1])
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    loose = {k: v.replace(os.path.dirname(v[6:]), str(d)) for k, v in ipc.items()}
    assert usable_ipc_endpoints(loose, host, b.bind_address, names) is None


def test_a_second_broker_on_the_same_port_number_serves_tcp_only(tcp_broker, broker_addr):
    """Two brokers on one port of two interfaces must not share (and unlink) ipc sockets."""
    b = tcp_broker()
    assert b.ipc_endpoints
    _, port = split_tcp(broker_addr)
    second = Broker(f"tcp://127.0.0.2:{port}", ExperimentConfig())
    try:
        assert second.ipc_endpoints == {}
    finally:
        second.close()
    assert Path(b.ipc_endpoints["registry"][len("ipc://") :]).exists()
