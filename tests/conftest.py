"""Shared fixtures: free ports, real `zrl` child processes that are always cleaned up by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from zrl.config import DEFAULT_STREAMS
from zrl.roles.base import RoleError, registry_request
from zrl.transport import protocol as P
from zrl.transport.sockets import broker_endpoints, free_port_range

REPO = Path(__file__).resolve().parents[1]


def kill_pids(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, wait, then SIGKILL every pid still alive (processes we started only)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


@pytest.fixture
def zmq_ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def broker_addr() -> str:
    n = len(broker_endpoints("tcp://127.0.0.1:1", list(DEFAULT_STREAMS)))
    return f"tcp://127.0.0.1:{free_port_range(n)}"


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start `python -m zrl ARGS...` with its output in tmp_path; killed by PID at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, log_name: str | None = None) -> subprocess.Popen[bytes]:
        name = log_name or "-".join(a for a in args[:2] if not a.startswith("-"))
        log = open(tmp_path / f"{name}-{len(procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "zrl", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
        log.close()
        procs.append(proc)
        return proc

    yield start
    kill_pids([p.pid for p in procs])


def wait_for(
    predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.1
) -> object:
    """Poll until predicate() is truthy; fail the test with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


def run_broker_address(proc: subprocess.Popen, run_dir: Path, log: Path) -> str:
    """The broker address a `zrl run` child writes into its run directory (fails with the
    run's log if it exits first)."""
    addr_file = run_dir / "broker_address"
    wait_for(lambda: addr_file.exists() or proc.poll() is not None, timeout=60)
    assert proc.poll() is None, log.read_text()[-3000:]
    return addr_file.read_text().strip()


def zrl_status_json(addr: str) -> dict[str, Any]:
    """`zrl status --json` as a user would run it (a real subprocess)."""
    out = subprocess.run(
        [sys.executable, "-m", "zrl", "status", "--broker", addr, "--json", "--timeout", "5"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status_rows(ctx: zmq.Context, addr: str) -> dict[str, dict[str, Any]]:
    """The broker's role table by id ({} when it does not answer within a second)."""
    try:
        reply = registry_request(ctx, addr, P.Message(P.STATUS), 1.0)
    except RoleError:
        return {}
    return {r["id"]: r for r in reply.meta.get("roles", [])}
