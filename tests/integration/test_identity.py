"""Every peer proves who it is, replayed through real processes (issue 39, item 4): a local
process says HELLO as the run's evaluator (with the real evaluator's pid, read from its
process) and as a host agent; the registry refuses it, the real evaluator keeps its entry, and
the run ends with what the real roles did.

- ``zrl run`` with no flag: the run made its own keys (0700, ignored by git); a client
  without them gets no answer and is told why; the forger holds the run's client keys (a
  process of the same user that read them) but no credential.
- ``zrl run --insecure`` (no keys at all, the credential alone stops the same forger) is
  replayed in ``test_hostile_run.py``'s run without keys.

Also: every listening socket of the run's processes is one docs/security.md names."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from zrl import __version__
from zrl.config.experiment import ExperimentConfig
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import read_status, refuses_handshake
from zrl.testing.probes import wait_for
from zrl.testing.processes import (
    REPO,
    end_run,
    run_broker_address,
    run_keys,
    status_rows,
    zrl_processes,
    zrl_run_command,
)
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints, split_tcp
from zrl.transport.sockets import Channel, TransportStats, make_socket

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
ROLE_IDS = {"params-0", "replay-0", "learner-0", "actor-0", "actor-1", "evaluator-0"}


def documented_listeners() -> set[str]:
    """The roles docs/security.md's table of listening sockets names."""
    text = (REPO / "docs" / "security.md").read_text()
    table = text.split("## Every listening socket of a run", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z]+)` ", table, flags=re.M))


def role_of(proc: psutil.Process) -> str | None:
    """The role a process of the run runs (`zrl start ROLE`), or None (the head, the zygote)."""
    cmd = proc.cmdline()
    return cmd[cmd.index("start") + 1] if "start" in cmd else None


def forged_hello(ctx: zmq.Context, addr: str, keys: Any, **meta: Any) -> P.Message | None:
    """One HELLO from a fresh connection, with ``keys`` (or none); the reply, if any."""
    sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=5000, sndtimeo_ms=1000, keys=keys)
    sock.connect(addr)
    ch = Channel(sock, "registry", "forger", TransportStats())
    try:
        ch.send(P.Message(P.HELLO, meta={"zrl_version": __version__, **meta}))
        got = ch.recv()
        return got[1] if got is not None else None
    finally:
        ch.close()


@pytest.mark.slow
@pytest.mark.waits  # a run without a target, ended by Ctrl-C: what it checks is not speed
def test_a_forged_role_gets_nothing_and_changes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    cmd = zrl_run_command(CONFIG, run_dir, ["stop.wall_time=120", "stop.eval_return=null"])
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    ctx = zmq.Context()
    addr = ""
    try:
        addr = run_broker_address(proc, run_dir, log)
        keys = run_keys(addr)
        assert keys is not None, list(run_dir.iterdir())  # keyed with no flag

        def all_alive() -> bool:
            r = status_rows(ctx, addr)
            return ROLE_IDS <= set(r) and all(r[i]["state"] == "alive" for i in ROLE_IDS)

        wait_for(lambda: all_alive() or proc.poll() is not None, timeout=120, interval=0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        rows = status_rows(ctx, addr)
        evaluator = rows["evaluator-0"]

        if keys is not None:  # (always: the run's own keys)
            assert stat.S_IMODE((run_dir / "keys").stat().st_mode) == 0o700
            assert (run_dir / "keys" / ".gitignore").read_text().splitlines()[-1] == "*"
            # Without the keys: no answer, and the handshake is refused (the cause is named).
            with pytest.raises(RoleError):
                read_status(ctx, addr, 2.0)
            assert refuses_handshake(ctx, addr, 5.0)

        # The forger: the evaluator's id, host and real pid; then a host agent. No credential,
        # then a made-up one.
        for credential in (None, "0" * 64):
            for meta in (
                {"role": "evaluator", "id": "evaluator-0", "index": 0},
                {"role": "host", "id": "host-0", "index": 0},
            ):
                reply = forged_hello(
                    ctx,
                    addr,
                    keys,
                    host=evaluator["host"],
                    pid=evaluator["pid"],
                    credential=credential,
                    **meta,
                )
                assert reply is not None and reply.kind == P.REFUSED, reply

        reasons = read_status(ctx, addr, 5.0, keys)["broker"]["rejected"]
        assert reasons.get("hello without a valid credential") == 4, reasons
        now = status_rows(ctx, addr)
        assert "host-0" not in now
        for rid in ROLE_IDS:  # the same processes, never displaced
            assert now[rid]["pid"] == rows[rid]["pid"] and now[rid]["restarts"] == 0, now[rid]
            assert now[rid]["state"] == "alive", now[rid]

        # Every listening socket of the run is one docs/security.md names.
        documented = documented_listeners()
        host, base = split_tcp(addr)
        broker_ports = {
            split_tcp(e)[1]
            for e in broker_endpoints(addr, ExperimentConfig().broker.streams).values()
        }
        for p in zrl_processes(addr):
            listening = [c for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            role = role_of(p)
            for c in listening:
                assert role in documented, (role, c, p.cmdline())
                if role == "broker":
                    assert c.laddr.port in broker_ports, (c, broker_ports)
                assert c.laddr.ip == host, (role, c)  # a loopback run listens on loopback only

        # The run goes on as before: its learner updates and its (real) evaluator evaluates
        # weights newer than those it had at the forgery; then Ctrl-C ends it, as a user would.
        seen = evaluator["info"].get("evaluated_version", 0)

        def evaluated_since() -> bool:
            r = status_rows(ctx, addr)
            return r["evaluator-0"]["info"].get("evaluated_version", 0) > seen

        wait_for(evaluated_since, timeout=90, message="no evaluation after the forgery")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        assert proc.returncode == 130, log.read_text()[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert not summary["failed"] and summary["updates"] > 0, summary
        assert summary["evaluations"] > 0, summary
        assert summary["restarts"] == {}, summary
    finally:
        assert end_run(proc, addr) == []
        ctx.destroy(linger=0)
