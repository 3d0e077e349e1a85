"""The children of ``zrl run``: ``ChildPool`` with a real broker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.roles.registry_client import registry_request
from zrl.run import placement
from zrl.run.aggregator import Aggregator
from zrl.run.children import Child
from zrl.run.placement import BrokerAccess
from zrl.run.pool import BROKER_SHARE_S, BrokerPortTaken, ChildPool
from zrl.run.rundir import RunDir
from zrl.testing.probes import wait_for
from zrl.testing.processes import kill_pids
from zrl.transport import protocol as P
from zrl.transport.endpoints import free_port_range, split_tcp


def config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {"name": "pool-test", "env": {"id": "CartPole-v1"}, "roles": {"actors": 0}}
    )


def pool_on(tmp_path: Path, access: BrokerAccess) -> ChildPool:
    cfg = config()
    rundir = RunDir(tmp_path / "run", cfg, Factories())
    rundir.prepare(Aggregator(), resume=False)
    return ChildPool(
        cfg, Factories(), rundir, access, zmq.Context.instance(), inproc=False, log_level="INFO"
    )


@pytest.fixture
def taken_port():
    """A listening socket on the first port of a range ``free_port_range`` would have given."""
    base = free_port_range(20)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", base))
    sock.listen(1)
    yield base
    sock.close()


def test_ports_taken_before_the_broker_binds_them_are_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    # Another process takes the range between `zrl run` probing it and the broker binding it.
    chosen = iter([taken_port])
    real = free_port_range
    monkeypatch.setattr(
        placement,
        "free_port_range",
        lambda count, host="127.0.0.1": next(chosen, None) or real(count, host),
    )
    access = BrokerAccess.of(
        config(), inproc=False, port=None, keys_dir=None, insecure=False, inproc_name="t"
    )
    assert split_tcp(access.broker_addr)[1] == taken_port and access.port_count > 0
    pool = pool_on(tmp_path, access)
    try:
        pool.start_broker()
        moved = split_tcp(access.broker_addr)[1]
        assert moved != taken_port
        assert access.bind_addr.endswith(f":{moved}") and access.public_addr.endswith(f":{moved}")
        reply = registry_request(pool.ctx, access.broker_addr, P.Message(P.STATUS), 5.0)
        assert reply.kind == P.STATUS_REPLY
    finally:
        pool.stop()
        pool.zygote.stop()


def test_a_port_the_user_chose_is_not_changed_when_taken(tmp_path: Path, taken_port: int) -> None:
    access = BrokerAccess.of(
        config(), inproc=False, port=taken_port, keys_dir=None, insecure=False, inproc_name="t"
    )
    assert access.port_count == 0
    pool = pool_on(tmp_path, access)
    try:
        with pytest.raises(BrokerPortTaken, match="Address already in use"):
            pool.start_broker()
        assert split_tcp(access.broker_addr)[1] == taken_port
    finally:
        pool.stop()
        pool.zygote.stop()


def stubborn_ready(pid: int) -> bool:
    """Whether the process ignores SIGTERM yet (its handler is set once python started)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            ignored = next(line for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"


def test_a_stop_with_a_deadline_kills_what_still_runs_by_then(tmp_path: Path) -> None:
    """After Ctrl-C the head's stop is bound to a deadline: roles (and a broker) that ignore
    SIGTERM, or take long to end, are killed by then rather than given STOP_GRACE_S each."""
    access = BrokerAccess.of(
        config(), inproc=False, port=None, keys_dir=None, insecure=False, inproc_name="t"
    )
    pool = pool_on(tmp_path, access)
    procs = []
    for role, index in (("actor", 0), ("learner", 0), ("broker", 0)):
        child = Child(role, index, tmp_path / f"{role}.log")
        child.proc = subprocess.Popen([sys.executable, "-c", STUBBORN])
        procs.append(child.proc)
        if role == "broker":
            pool.broker = child
        else:
            pool.children.append(child)
    try:
        wait_for(lambda: all(stubborn_ready(p.pid) for p in procs), timeout=30)
        told: list[float] = []
        started = time.monotonic()
        pool.stop(before_broker=lambda: told.append(time.monotonic()), deadline=started + 3.0)
        took = time.monotonic() - started
        assert all(p.poll() == -signal.SIGKILL for p in procs), [p.poll() for p in procs]
        assert told and told[0] - started <= 3.0 - BROKER_SHARE_S + 0.5  # the broker's share left
        assert took < 3.0 + 2.0, took  # the deadline, and a moment to reap the killed
    finally:
        kill_pids([p.pid for p in procs])
