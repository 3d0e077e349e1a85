"""Shared fixtures: zmq contexts, free broker addresses, real `zrl` child processes that are
always cleaned up by PID. The harness itself lives in :mod:`zrl.testing`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from zrl.config.sections import DEFAULT_STREAMS
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for  # noqa: F401 - old import path; use zrl.testing
from zrl.testing.processes import (  # noqa: F401 - old import path; use zrl.testing
    GUARD_S,
    REPO,
    kill_pids,
    run_broker_address,
    start_zrl,
    status_rows,
    zrl_status_json,
)
from zrl.transport.endpoints import broker_endpoints, free_port_range


@pytest.fixture
def zmq_ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def inproc(zmq_ctx: zmq.Context, request: pytest.FixtureRequest) -> Iterator[InProc]:
    """An inproc broker, roles in threads and test sockets (:class:`zrl.testing.inproc.InProc`,
    its address named after the test module), all stopped and closed after the test."""
    h = InProc(zmq_ctx, request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def broker_addr() -> str:
    n = len(broker_endpoints("tcp://127.0.0.1:1", list(DEFAULT_STREAMS)))
    return f"tcp://127.0.0.1:{free_port_range(n)}"


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start `python -m zrl ARGS...` with its output in tmp_path (``env``: variables added to
    ours); killed by PID at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        *args: str, log_name: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        name = log_name or "-".join(a for a in args[:2] if not a.startswith("-"))
        proc = start_zrl(*args, log=tmp_path / f"{name}-{len(procs)}.log", cwd=REPO, env=env)
        procs.append(proc)
        return proc

    yield start
    kill_pids([p.pid for p in procs])


TRAIN_GROUPS = ("trains", "trains-2")
"""The xdist groups of the tests that train (``pytest_collection_modifyitems``)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n 3 --dist loadgroup`` (CI, on 2 cores) the tests that train through
    real processes run in two groups (``TRAIN_GROUPS``, every other one, about the same
    time each), one after another within a group, while the third worker takes everything
    else: three workers keep both cores busy while a test waits (a process start, a sleep, a
    subprocess's I/O), which two left idle 16 % of the time. Two trainings side by side only
    take longer: their runs are bounded by env steps or updates. The order is the groups
    first (CI's critical path starts at once), then the other slow tests (``waits``: long but
    mostly waiting, started early so that no long test is left for the end), then the rest.

    A slow test without a timeout of its own gets one past :data:`GUARD_S` (its run's wall
    time, a guard for a loaded machine) plus what it does around the run, not pytest's 300 s."""
    trains, waits, rest = [], [], []
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(GUARD_S + 300))
        if item.get_closest_marker("slow") and not item.get_closest_marker("waits"):
            group = TRAIN_GROUPS[len(trains) % len(TRAIN_GROUPS)]
            item.add_marker(pytest.mark.xdist_group(group))
            trains.append(item)
        elif item.get_closest_marker("slow") or item.get_closest_marker("waits"):
            waits.append(item)
        else:
            rest.append(item)
    items[:] = trains + waits + rest
