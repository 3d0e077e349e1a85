"""Multi-host runs for real: every "host" is a network namespace with its own address.

Each test builds its hosts with :class:`tests.integration.netns.Hosts` (a bridge in a private
"switch" namespace, one veth per host, 10.213.N.0/24) and starts the roles with the same
``zrl start ROLE --broker tcp://10.213.N.1:PORT`` (or ``zrl host``) a user would type on each
host, each host's in a working directory of its own, as on machines that share no disk. The
only addresses bound are inside those namespaces, so a fixed port cannot clash with anything.

Status is read from inside h0: a small poller (one ``registry_request`` STATUS every
``POLL_S``, one JSON line each) for the waits, and the ``zrl status`` command itself for
the final checks. Every process is killed by PID and every namespace deleted in the
fixture's ``finally``, whether the test passed or not.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.netns import REPO, Hosts
from zrl.testing.probes import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
PORT = 5555  # inside namespaces made for this test only: always free
POLL_S = 0.25
STARTUP_TIMEOUT_S = 75.0  # seven torch processes starting on two shared cores
RANDOM_POLICY_RETURN = 22.0
FAKE_VERSION = 10**6
FAKE_TRAJECTORIES = 100
SKEW_TRAJECTORIES = 3  # trajectories sent between an actor's and the shard's heartbeat

# One STATUS request every POLL_S to the broker; one JSON line per answer (or failure).
POLLER = r"""
import json, sys, time
import zmq
from zrl.roles.base import RoleError, registry_request
from zrl.transport import protocol as P
from zrl.transport.security import load_keys

broker, keydir, interval, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
keys = load_keys(keydir) if keydir != "-" else None
ctx = zmq.Context()
with open(out, "a", buffering=1) as f:
    while True:
        t = time.time()
        try:
            meta = registry_request(ctx, broker, P.Message(P.STATUS), 2.0, keys).meta
            f.write(json.dumps({"t": t, "ok": True, "status": meta}, default=str) + "\n")
        except RoleError as exc:
            f.write(json.dumps({"t": t, "ok": False, "error": str(exc)}) + "\n")
        time.sleep(max(0.0, interval - (time.time() - t)))
"""

# A client on a 4th host. mode "attack": try every way in (register, publish fake weights,
# push trajectories, read the bus); mode "control": the same network path with the real
# keys must work (status answers, weights arrive), or the attack results would mean nothing.
CLIENT = r"""
import dataclasses, json, os, socket, sys, threading, time
from pathlib import Path
import numpy as np
import zmq, zmq.auth
from zmq.utils.monitor import recv_monitor_message
from zrl import __version__
from zrl.config.sections import DEFAULT_STREAMS
from zrl.roles.base import RoleError, registry_request
from zrl.transport import protocol as P
from zrl.transport.security import load_keys
from zrl.transport.endpoints import broker_endpoints
from zrl.transport.sockets import Channel, TransportStats, make_socket

broker, keydir, mode = sys.argv[1:4]
fake_version, fake_count = int(sys.argv[4]), int(sys.argv[5])
keys = None
if keydir != "-":
    keys = load_keys(keydir)
    # The server public key we were given (server.key), whatever our own server.key_secret holds.
    server_public, _ = zmq.auth.load_certificate(Path(keydir) / "server.key")
    keys = dataclasses.replace(keys, server_public=server_public)
eps = broker_endpoints(broker, list(DEFAULT_STREAMS))
ctx = zmq.Context()
stats = TransportStats()
result = {"mode": mode, "keys": keydir}

EVENTS = {v: k for k, v in vars(zmq).items() if k.startswith("EVENT_") and isinstance(v, int)}
events = []
def watch(sock, name):
    mon = sock.get_monitor_socket()
    def run():
        while True:
            try:
                ev = recv_monitor_message(mon)
            except zmq.ZMQError:
                return
            events.append(f"{name}:{EVENTS.get(ev['event'], ev['event'])}")
            if ev["event"] == zmq.EVENT_MONITOR_STOPPED:
                return
    threading.Thread(target=run, daemon=True).start()

sub = make_socket(ctx, zmq.SUB, rcvtimeo_ms=100, keys=keys)
sub.setsockopt(zmq.SUBSCRIBE, b"")
watch(sub, "sub")
sub.connect(eps["topics_out"])
subch = Channel(sub, "bus", "client", stats, topics=True)
seen = {"messages": 0, "weights": 0, "max_weights_version": None}
def drain(until):
    while time.monotonic() < until:
        got = subch.recv()
        if got is None:
            continue
        seen["messages"] += 1
        m = got[1]
        if m.kind == P.WEIGHTS:
            seen["weights"] += 1
            v = m.meta.get("version")
            if isinstance(v, int):
                seen["max_weights_version"] = max(v, seen["max_weights_version"] or 0)
            if mode == "control":
                return

if mode == "control":
    status = registry_request(ctx, broker, P.Message(P.STATUS), 10.0, keys)
    result["status_roles"] = len(status.meta["roles"])
    drain(time.monotonic() + 15.0)
else:
    # Fake weights on the bus, as the parameter server would publish them.
    pub = make_socket(ctx, zmq.PUB, keys=keys)
    pub.connect(eps["topics_in"])
    pubch = Channel(pub, "weights", "params-0", stats, topics=True)
    # Valid-looking trajectories into the experience stream, as an actor would push them.
    push = make_socket(ctx, zmq.PUSH, sndhwm=1000, sndtimeo_ms=100, keys=keys)
    watch(push, "push")
    push.connect(eps["experience_in"])
    pushch = Channel(push, "experience", "actor-9", stats)
    time.sleep(0.5)
    E, T = 4, 32
    traj = {
        "obs": np.zeros((E, T, 4), np.float32), "action": np.zeros((E, T), np.int64),
        "reward": np.ones((E, T), np.float32), "terminated": np.zeros((E, T), bool),
        "truncated": np.zeros((E, T), bool), "valid": np.ones((E, T), bool),
        "next_obs": np.zeros((E, T, 4), np.float32), "priority": np.ones((E, T), np.float32),
    }
    # Each send waits up to 100 ms for a connection to queue on. A refused connection is
    # dropped with its queue and retried, so few (or none) of the 100 get queued anywhere.
    queued, until = 0, time.monotonic() + 3.0
    for i in range(fake_count):
        msg = P.Message(
            P.TRAJECTORY,
            meta={"weights_version": 0, "actor": 9, "env_steps": (i + 1) * E * T},
            arrays=traj,
        )
        while time.monotonic() < until:
            if pushch.send(msg):
                queued += 1
                break
    result["push_queued_locally"] = queued
    published = 0
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        weights = P.Message(
            P.WEIGHTS, meta={"version": fake_version}, arrays={"w": np.zeros(4, np.float32)}
        )
        pubch.send(weights, topic=P.WEIGHTS_TOPIC, block=False)
        published += 1
        drain(time.monotonic() + 0.05)
    result["fake_weights_published"] = published
    # Register as a role: a HELLO the broker must never answer.
    dealer = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=3000, keys=keys)
    watch(dealer, "registry")
    dealer.connect(broker)
    reg = Channel(dealer, "registry", "actor", stats)
    hello = {
        "role": "actor", "id": None, "index": 9, "host": socket.gethostname(),
        "pid": os.getpid(), "rpc": "", "zrl_version": __version__,
    }
    reg.send(P.Message(P.HELLO, meta=hello), block=False)
    got = reg.recv()
    result["hello_reply"] = None if got is None else got[1].kind
    try:
        status = registry_request(ctx, broker, P.Message(P.STATUS), 3.0, keys)
        result["status_reply"] = len(status.meta["roles"])
    except RoleError as exc:
        result["status_reply"] = None
        result["status_error"] = str(exc)
    drain(time.monotonic() + 1.0)
result["bus"] = seen
time.sleep(0.2)
result["events"] = sorted(set(events))
print(json.dumps(result))
sys.stdout.flush()
os._exit(0)
"""


class Cluster:
    """zrl roles on namespaced hosts, their logs, and the broker's status as h0 sees it."""

    def __init__(self, hosts: Hosts, tmp: Path, keys: Path | None = None) -> None:
        self.hosts = hosts
        self.tmp = tmp
        self.keys = keys
        self.broker = f"tcp://{hosts.addrs[0]}:{PORT}"
        self.logs: dict[str, Path] = {}
        self.expected: dict[str, int] = {}  # role id -> host index
        self.pids: dict[str, int] = {}
        self.status_file = tmp / "status.jsonl"
        self.dirs = [tmp / f"h{i}" for i in range(len(hosts.names))]
        for d in self.dirs:
            d.mkdir()  # each host's working directory: a disk of its own
        (tmp / "poller.py").write_text(POLLER)
        (tmp / "client.py").write_text(CLIENT)

    def _key_args(self, keys: Path | None = None) -> list[str]:
        k = keys or self.keys
        return ["--keys", str(k)] if k is not None else []

    def start_broker(self, *sets: str) -> None:
        args = ["start", "broker", "--bind", self.broker, "--config", str(CONFIG)]
        for s in sets:
            args += ["--set", s]
        args += self._key_args() if self.keys is not None else ["--insecure"]
        self.logs["broker"] = self.tmp / "broker.log"
        self.pids["broker"] = self.hosts.zrl(
            0, *args, log=self.logs["broker"], cwd=self.dirs[0]
        ).pid
        self.hosts.exec(
            0,
            sys.executable,
            str(self.tmp / "poller.py"),
            self.broker,
            str(self.keys or "-"),
            str(POLL_S),
            str(self.status_file),
            log=self.tmp / "poller.log",
        )

    def start(self, host: int, role: str, index: int = 0) -> None:
        rid = f"{role}-{index}"
        args = [
            "start",
            role,
            "--broker",
            self.broker,
            "--index",
            str(index),
            "--connect-timeout",
            "60",
            *self._key_args(),
        ]
        self.logs[rid] = self.tmp / f"{rid}.log"
        self.pids[rid] = self.hosts.zrl(host, *args, log=self.logs[rid], cwd=self.dirs[host]).pid
        self.expected[rid] = host

    # --- status ---------------------------------------------------------------------------

    def latest(self) -> dict[str, Any] | None:
        """The newest status the poller got, or None."""
        try:
            lines = self.status_file.read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            return rec if rec.get("ok") else None
        return None

    def history(self, since: float) -> list[dict[str, dict[str, Any]]]:
        """Every status the poller got since ``since`` (time.time()), as rows, oldest first."""
        out = []
        for line in self.status_file.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("ok") and rec["t"] >= since:
                out.append(self.rows(rec))
        return out

    def rows(self, status: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        status = status or self.latest()
        return {r["id"]: r for r in (status or {}).get("status", {}).get("roles", [])}

    def wait(
        self, what: str, predicate: Callable[[dict[str, dict[str, Any]]], bool], timeout: float
    ) -> dict[str, dict[str, Any]]:
        """Poll the latest status until ``predicate(rows)``; fail with the logs if it never is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.rows()
            if rows and predicate(rows):
                return rows
            self.check_processes()
            time.sleep(POLL_S)
        raise AssertionError(f"{what}: not within {timeout:g}s\n{self.report()}")

    def all_alive(self, rows: dict[str, dict[str, Any]]) -> bool:
        return all(rows.get(rid, {}).get("state") == "alive" for rid in self.expected)

    def check_processes(self) -> None:
        """Fail at once, with the logs, if a role exited or a broker device thread died."""
        for p in self.hosts.procs:
            if p.poll() is not None and p.pid in self.pids.values():
                raise AssertionError(f"pid {p.pid} exited with {p.returncode}\n{self.report()}")
        broker_log = self.logs["broker"].read_text(errors="replace")
        if "Exception in thread zrl-device-" in broker_log:
            # The broker process lives on, and every role stays "alive", but a stream is dead.
            raise AssertionError(f"a broker device thread died:\n{broker_log[-3000:]}")

    def cli_status(
        self, host: int = 0, *, as_json: bool = True, keys: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "zrl", "status", "--broker", self.broker, "--timeout", "5"]
        if as_json:
            args.append("--json")
        return self.hosts.run(host, *args, *self._key_args(keys), timeout=60)

    def report(self) -> str:
        rows = self.rows()
        lines = ["status rows:"]
        for rid, r in sorted(rows.items()):
            lines.append(
                f"  {rid}: {r['state']} age {r['age']} pid {r['pid']} rpc {r['rpc']!r} "
                f"info {r.get('info')}"
            )
        for name, path in self.logs.items():
            try:
                tail = path.read_text(errors="replace").splitlines()[-15:]
            except FileNotFoundError:
                tail = ["(no log)"]
            lines.append(f"--- {name} ({path}) ---")
            lines.extend(tail)
        return "\n".join(lines)


def start_apex(cluster: Cluster) -> None:
    """h0: broker, params, learner; h1: replay; h2: two actors and the evaluator."""
    cluster.start(0, "params")
    cluster.start(0, "learner")
    cluster.start(1, "replay")
    cluster.start(2, "actor", 0)
    cluster.start(2, "actor", 1)
    cluster.start(2, "evaluator")


def experience_counts(rows: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(trajectories the actors say they sent, trajectories the replay shard received)."""
    sent = sum(
        r["streams"].get("experience", {}).get("sent", 0)
        for r in rows.values()
        if r["role"] == "actor"
    )
    received = rows["replay-0"]["streams"].get("experience", {}).get("received", 0)
    return sent, received


# --- 1. a run across three hosts learns ------------------------------------------------------


@pytest.mark.waits  # a multi-host launch: mostly waiting on hosts; a low CartPole target
@pytest.mark.timeout(180)
def test_apex_across_three_hosts_learns(make_hosts: Callable[[int], Hosts], tmp_path: Path) -> None:
    hosts = make_hosts(3)
    c = Cluster(hosts, tmp_path)
    c.start_broker()
    start_apex(c)
    c.wait("every role registered and alive", c.all_alive, STARTUP_TIMEOUT_S)
    first = c.rows()

    def learned(rows: dict[str, dict[str, Any]]) -> bool:
        return (
            rows["learner-0"]["info"].get("updates", 0) > 500
            and (rows["evaluator-0"]["info"].get("eval_return") or 0) > 50
        )

    rows = c.wait("learner updates > 500 and eval return > 50", learned, 90.0)
    assert rows["replay-0"]["info"]["size"] > first["replay-0"]["info"].get("size", 0)
    assert rows["replay-0"]["info"]["size"] >= 1000, c.report()  # past min_size: it sampled
    assert rows["evaluator-0"]["info"]["eval_return"] > 2 * RANDOM_POLICY_RETURN
    # Weights crossed hosts: the actors in h2 act with versions the params server in h0 made.
    # Waited for, not read off the rows above: an actor applies new weights only between
    # trajectories, and one whose first acks left the shard before its subscription reached
    # the broker waits out ACK_TIMEOUT_S (10 s) with a full window; a run that learns in 6 s
    # (seen in CI) gets there first.
    c.wait(
        "every actor and the evaluator act with weights from the params server",
        lambda r: all(
            r.get(rid, {}).get("info", {}).get("weights_version", 0) > 0
            for rid in ("actor-0", "actor-1", "evaluator-0")
        ),
        30.0,
    )

    # `zrl status --json` from inside h0: every role alive, registered from where we started it.
    done = c.cli_status(0)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    table = {r["id"]: r for r in status["roles"]}
    assert set(table) == set(c.expected), table.keys()
    namespaces = set()
    for rid, host in c.expected.items():
        row = table[rid]
        assert row["state"] == "alive", (rid, row)
        assert row["pid"] == c.pids[rid], (rid, row["pid"], c.pids[rid])
        assert row["pid"] in hosts.pids_in(host)
        ns = hosts.netns_of(row["pid"])
        assert ns == hosts.names[host], (rid, ns)
        namespaces.add(ns)
    assert len(namespaces) == 3
    # The one role with an rpc socket advertises its host's address, not loopback.
    assert table["params-0"]["rpc"].startswith(f"tcp://{hosts.addrs[0]}:"), table["params-0"]
    assert status["broker"]["bind"] == c.broker
    # (The host column cannot tell these hosts apart: namespaces share one hostname. Only the
    # pid and, for roles with an rpc socket, the advertised address can.)

    # The human-readable table, asked from another host (h1).
    done = c.cli_status(1, as_json=False)
    assert done.returncode == 0, done.stderr
    for rid in c.expected:
        line = next((ln for ln in done.stdout.splitlines() if f" {rid} " in ln), "")
        assert "alive" in line, (rid, done.stdout)
    assert "alive per host" in done.stdout
    c.check_processes()


# --- 2. CURVE keys: an outsider on the network gets nothing in and nothing out ----------------


@pytest.mark.timeout(180)
@pytest.mark.waits  # waits for one update, no learning target
def test_keys_keep_outsiders_out(make_hosts: Callable[[int], Hosts], tmp_path: Path) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    for d in (keys, other):
        subprocess.run(
            [sys.executable, "-m", "zrl", "keys", "init", str(d)],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=60,
        )
    # The outsider knows whom to talk to (the server's public key), but is not authorized.
    shutil.copy(keys / "server.key", other / "server.key")

    hosts = make_hosts(4)
    c = Cluster(hosts, tmp_path, keys=keys)
    c.start_broker()
    start_apex(c)
    c.wait("every role registered and alive (CURVE)", c.all_alive, STARTUP_TIMEOUT_S)
    c.wait(
        "learner updating over CURVE",
        lambda rows: rows["learner-0"]["info"].get("updates", 0) > 0,
        60.0,
    )

    def client(keydir: Path | None, mode: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"client-{mode}-{keydir.name if keydir else 'nokeys'}.out"
        c.logs[log.stem] = log
        return hosts.exec(
            3,
            sys.executable,
            str(tmp_path / "client.py"),
            c.broker,
            str(keydir or "-"),
            mode,
            str(FAKE_VERSION),
            str(FAKE_TRAJECTORIES),
            log=log,
        )

    def result(proc: subprocess.Popen[bytes], name: str) -> dict[str, Any]:
        proc.wait(timeout=60)
        out = c.logs[name].read_text(errors="replace")
        assert proc.returncode == 0, out[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    # Control: from the same 4th host, the real keys get a status answer and live weights.
    ctl = result(client(keys, "control"), "client-control-keys")
    assert ctl["status_roles"] == len(c.expected), ctl
    assert ctl["bus"]["weights"] >= 1, ctl
    assert "sub:EVENT_HANDSHAKE_SUCCEEDED" in ctl["events"], ctl

    before = c.rows()
    _, before_received = experience_counts(before)
    attack_started = time.time()
    attackers = [client(other, "attack"), client(None, "attack")]
    wrong_status = c.cli_status(3, keys=other)
    wrong = result(attackers[0], "client-attack-other")
    plain = result(attackers[1], "client-attack-nokeys")
    time.sleep(3.0)  # let any fake message that got in show up in heartbeats

    assert wrong_status.returncode == 2, (wrong_status.stdout, wrong_status.stderr)
    assert "no answer" in wrong_status.stderr, wrong_status.stderr
    for res in (wrong, plain):
        assert res["hello_reply"] is None, res  # cannot register
        assert res["status_reply"] is None, res  # cannot even ask
        assert res["bus"]["messages"] == 0, res  # reads nothing on the topic bus
        assert res["fake_weights_published"] > 0
        assert not any("HANDSHAKE_SUCCEEDED" in e for e in res["events"]), res
        assert any("CONNECTED" in e for e in res["events"]), res  # the network path is there
    # Right server key, unknown client key: refused by the authenticator (ZAP), not by chance.
    assert any("HANDSHAKE_FAILED_AUTH" in e for e in wrong["events"]), wrong

    after = c.rows()
    assert set(after) == set(c.expected), after.keys()  # no outsider registered
    for rid, row in after.items():
        assert row["state"] == "alive", (rid, row)
        assert row["pid"] == c.pids[rid]
        assert row["restarts"] == 0, (rid, row)
        assert row["info"].get("weights_version", 0) < FAKE_VERSION, (rid, row["info"])
        assert row["dropped"] == before[rid]["dropped"], (rid, row)  # nothing even malformed
    # The outsider's trajectories never reached replay: the shard has received no more than
    # the two real actors sent (give or take one heartbeat of skew between their reports),
    # in every status since the attack began.
    excess = [
        received - sent for sent, received in map(experience_counts, c.history(attack_started))
    ]
    assert excess and min(excess) <= SKEW_TRAJECTORIES, excess
    assert max(excess) <= SKEW_TRAJECTORIES + 2, excess
    sent, received = experience_counts(after)
    assert received > before_received, "the run stalled during the attack"
    assert sent - received <= 2 * 2 + SKEW_TRAJECTORIES, (sent, received)  # max_in_flight each
    assert after["learner-0"]["info"]["updates"] > before["learner-0"]["info"]["updates"]
    c.check_processes()


# --- 3. a host that vanishes is shown dead within the heartbeat window -----------------------


@pytest.mark.waits
@pytest.mark.timeout(150)
def test_vanished_host_is_marked_dead(make_hosts: Callable[[int], Hosts], tmp_path: Path) -> None:
    timeout = 2.0
    hosts = make_hosts(3)
    c = Cluster(hosts, tmp_path)
    c.start_broker(f"broker.heartbeat_timeout={timeout}")
    c.start(0, "replay")
    c.start(1, "actor", 1)
    c.start(2, "actor", 0)
    c.wait("every role registered and alive", c.all_alive, STARTUP_TIMEOUT_S)
    time.sleep(1.0)
    assert c.all_alive(c.rows()), c.report()

    def time_to_dead(rid: str, t0: float) -> float:
        deadline = t0 + timeout + 10.0
        while time.time() < deadline:
            status = c.latest()
            if status and status["t"] > t0 and c.rows(status).get(rid, {}).get("state") == "dead":
                return status["t"] - t0
            time.sleep(POLL_S / 2)
        raise AssertionError(f"{rid} not marked dead within {timeout + 10:g}s\n{c.report()}")

    # h2's cable is pulled: its actor keeps running but can no longer be heard.
    t0 = time.time()
    hosts.unplug(2)
    took = time_to_dead("actor-0", t0)
    print(f"unplugged h2: actor-0 shown dead after {took:.2f}s")
    # heartbeat_timeout, plus at most one heartbeat interval, one liveness check and a poll.
    assert took <= timeout + 1.5, (took, c.report())
    assert hosts.run(2, "ip", "-br", "link").stdout.count("eth0") == 0
    rows = c.rows()
    assert rows["actor-0"]["pid"] == c.pids["actor-0"]
    assert rows["actor-1"]["state"] == "alive" and rows["replay-0"]["state"] == "alive", rows
    proc0 = next(p for p in hosts.procs if p.pid == c.pids["actor-0"])
    assert proc0.poll() is None, "the unplugged actor should still be running"

    # h1's processes die at once (kill -9): no BYE, only silence.
    t1 = time.time()
    assert hosts.kill9(1) == [c.pids["actor-1"]]
    took = time_to_dead("actor-1", t1)
    print(f"kill -9 in h1: actor-1 shown dead after {took:.2f}s")
    assert took <= timeout + 1.5, (took, c.report())
    rows = c.rows()
    assert rows["replay-0"]["state"] == "alive", rows
    assert rows["actor-0"]["state"] == "dead", rows


# --- 4. the README's "Many hosts", as written: a head, and one `zrl host` per host -------------


def readme_hosts_block() -> list[tuple[str, list[str]]]:
    """The README's "Many hosts" commands, as (the host its comment names, argv), in order:
    the bash block under that heading, continuation lines joined, comments dropped."""
    text = (REPO / "README.md").read_text().split("## Many hosts", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands, where = [], "node1"
    for line in block.splitlines():
        if line.startswith("# "):
            where = line[2:].split()[0].rstrip(":,")
            continue
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append((where, argv))
    return commands


@pytest.mark.waits  # a multi-host launch: mostly waiting on hosts; a low CartPole target
@pytest.mark.timeout(300)
def test_the_readme_hosts_each_in_its_own_directory(
    make_hosts: Callable[[int], Hosts], tmp_path: Path
) -> None:
    """The README's "Many hosts" block as written, node1 and node2 network namespaces each in
    a working directory of its own (node1's a clone: `configs/` there), the keys copied: only
    node1's address (10.0.0.1 in the README) is this test's, and the run stops at 100 rather
    than the config's 475 (CI's time, as the CartPole test does). The roles of node2
    register and run; `zrl status` answers from node2; the learner keeps its checkpoint under
    its host's working directory, never at the head's path, and the actors keep none; the
    head's summary.json says where each role's files are."""
    hosts = make_hosts(2)
    node1, node2 = tmp_path / "node1", tmp_path / "node2"
    node1.mkdir()
    node2.mkdir()
    (node1 / "configs").symlink_to(REPO / "configs")  # node1 works in a clone
    commands = readme_hosts_block()
    assert [(w, a[:2]) for w, a in commands] == [
        ("node1", ["zrl", "keys"]),
        ("node1", ["zrl", "start"]),
        ("node1", ["zrl", "host"]),
        ("node2", ["zrl", "host"]),
        ("anywhere", ["zrl", "status"]),
    ], commands
    broker = f"tcp://{hosts.addrs[0]}:{PORT}"

    def ours(argv: list[str]) -> list[str]:
        """A README line for this test's hosts: node1's address, nothing else changed."""
        return [a.replace("tcp://10.0.0.1:5555", broker) for a in argv[1:]]

    (_, keys_init), (_, start), (_, node1_host), (_, node2_host), (_, status) = commands
    subprocess.run(
        [sys.executable, "-m", "zrl", *ours(keys_init)],
        cwd=node1,
        check=True,
        capture_output=True,
        timeout=60,
    )
    shutil.copytree(node1 / "keys", node2 / "keys")  # "copy keys/ to every host"
    head = hosts.zrl(
        0,
        *ours(start),
        *("--set", "stop.eval_return=60", "--set", "stop.eval_window=1"),  # random: 22 +- 3
        log=tmp_path / "head.log",
        cwd=node1,
    )
    agents = [
        hosts.zrl(i, *ours(argv), log=tmp_path / f"agent-{i}.log", cwd=cwd)
        for i, cwd, argv in ((0, node1, node1_host), (1, node2, node2_host))
    ]

    def logs() -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(tmp_path.glob("*.log"))
        )

    def status_from_node2() -> dict[str, Any] | None:
        done = hosts.run(
            1, sys.executable, "-m", "zrl", *ours(status), "--json", timeout=60, cwd=node2
        )
        return json.loads(done.stdout) if done.returncode == 0 else None

    wanted = {"actor-0", "actor-1", "learner-0"}
    listed: list[set[str]] = []

    def listed_ids() -> set[str] | None:
        st = status_from_node2()
        ids = {r["id"] for r in st["roles"]} if st else set()
        listed.append(ids)
        return ids if wanted <= ids else None

    wait_for(
        listed_ids,
        timeout=180,
        interval=2.0,
        message=lambda: (
            f"zrl status from node2 never listed {sorted(wanted)}; it last listed "
            f"{sorted(listed[-1]) if listed else 'nothing'}\n{logs()}"
        ),
    )
    try:
        head.wait(timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the head did not reach its target\n{logs()}")
    assert head.returncode == 0, logs()
    for agent in agents:
        assert agent.wait(timeout=60) == 0, logs()
    summary = json.loads((node1 / "runs" / "exp1" / "summary.json").read_text())
    assert summary["reached_target"] and summary["stop_reason"] == "eval_return", summary
    took_part = summary["roles"]["took_part"]
    assert summary["roles"]["never_came"] == [], summary["roles"]
    head_files = (node1 / "runs" / "exp1" / "checkpoints").resolve()
    for rid in ("learner-0", "replay-0", "evaluator-0"):  # node1's, in the head's directory
        assert took_part[rid]["checkpoint_dir"] == str(head_files), took_part[rid]
    assert (head_files / "learner-0.pt").is_file()
    for rid in ("actor-0", "actor-1"):  # node2's actors keep nothing, anywhere
        assert took_part[rid]["state"] == "stopped" and "checkpoint_dir" not in took_part[rid]
    # node2 holds its keys and its agent's logs: no run directory, no checkpoints.
    assert sorted(p.name for p in node2.iterdir()) == ["keys", "zrl-logs"], list(node2.iterdir())
