"""Multi-host benchmark over network namespaces: what crossing "hosts" and CurveZMQ cost.

Every "host" is a network namespace on one bridge (``tests/integration/netns.py``: needs root
and iproute2). In one run:

(A) env steps/s of actors, one per namespace, in 1, 2 and 4 namespaces, against the same
    number of actors all in the broker's own namespace (same broker address, which is local
    there, so the kernel carries it like loopback: the difference is the veth + bridge hop).
    Broker and one replay shard run in h0 with ``replay.samples_per_insert: 0`` (inserts are
    never held back) and no learner. Both sets of a count start together; then only one set
    runs at a time (the other is SIGSTOPped), alternating ``--windows`` times, so both see the
    same load from whatever else shares the machine. A set's rate is the sum over its actors of
    their ``info.env_steps`` deltas in ``zrl status``, each divided by the time between the two
    heartbeats that carried them (status time minus row age).
(B) the throughput cost of CurveZMQ on the experience stream: 64 KiB zrl messages from a PUSH
    in h1 through the broker's ``experience`` device in h0 to a PULL in h2 (decoded and
    validated like a replay shard does), broker and both ends with ``--keys`` vs
    ``--insecure``, alternating, best of the rounds. Target: secure/insecure >= 0.7.
    The producer's first message on its connection is a tiny one-frame message: a large
    multipart first message makes the secure broker's device thread die (a zrl bug, see
    ``STREAM_END``); a run where a device died anyway is flagged in the table.
(C) actor hosts into one learner: for 1, 2 and 4 actor hosts (``--hosts``), one real APPO
    training run each (``--config``, default ``configs/cartpole_appo.yaml``): broker, one
    replay shard (its FIFO queue), params and one learner (``learner.device: auto``) in h0,
    one actor in each of h1..hN, each started with ``zrl start ROLE`` as in (A); nothing else
    changes between counts. After every actor steps and the learner has updated, ``--warmup``
    seconds of start-up are skipped, then over ``--train-seconds``: env steps/s (the actors'
    heartbeat-timed ``env_steps``, as in (A)), the learner's updates/s and samples trained/s,
    the learner's ``wait_share`` / ``copy_share`` / ``update_share`` / ``publish_share`` over
    that window (see ``window_shares``), the FIFO's mean fill and the share of polls that
    found it full, and the CPU cores each group of processes used; then the ratios against
    the first count. ``--train-rounds`` rounds run the counts interleaved (1, 2, 4, 1, ...)
    and add each count's medians. On one machine every "host" shares its cores: more actor
    hosts split the same CPUs with the learner (figures and reading: docs/benchmarks.md).
(D) weights fanned out per host: ``--relay-hosts`` H hosts (h1..hH) of ``--relay-followers`` F
    weights subscribers each, one publisher of ``--weights-mib`` MiB WEIGHTS on a broker's bus in
    h0, (i) every subscriber on the broker's bus (as a follower without a host agent), then
    (ii) through one ``WeightsRelay`` per host (``zrl.run.weights_relay``, the host agent's
    relay, in its own process) over ipc. Per version, published one at a time once the last
    has arrived everywhere (``--relay-versions``, after warm-up): the bytes h0's eth0 sent
    (the broker's egress; nothing else crosses it) and the time from the publish to the last
    subscriber's receipt. Each host's F subscribers are SUBs of one process (a follower's
    socket options; a version counts as there when all F have it).

Run from the repo root as root::

    python benchmarks/multihost.py                   # about 8 minutes
    python benchmarks/multihost.py --seconds 10 --counts 1,2 --rounds 1
    python benchmarks/multihost.py --skip-a --skip-b --hosts 1,2,4    # (C) only
    python benchmarks/multihost.py --skip-a --skip-b --skip-c --relay  # (D) only, 8 x 16

Every process is killed by PID and every namespace deleted on the way out, also on errors,
Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.netns import Hosts, kill_procs, netns_available  # noqa: E402

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
TRAIN_CONFIG = REPO / "configs" / "cartpole_appo.yaml"
TRAIN_PORT = 5600  # (C): the run with N actor hosts binds TRAIN_PORT + 100 * its position
TIME_PARTS = ("wait", "copy", "update", "publish")  # the learner's ``<part>_share`` fields
SHARE_KEYS = tuple(f"{part}_share" for part in TIME_PARTS)
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_CURVE_RATIO = 0.7
POLL_S = 0.5
START_TIMEOUT_S = 120.0
WARMUP_S = 1.5

POLLER = r"""
import json, sys, time
import zmq
from zrl.roles.base import RoleError, registry_request
from zrl.transport import protocol as P

broker, interval, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
ctx = zmq.Context()
with open(out, "a", buffering=1) as f:
    while True:
        t = time.time()
        try:
            meta = registry_request(ctx, broker, P.Message(P.STATUS), 2.0).meta
            f.write(json.dumps({"t": t, "roles": meta["roles"]}, default=str) + "\n")
        except RoleError:
            pass
        time.sleep(max(0.0, interval - (time.time() - t)))
"""

# Producer / consumer of part B: the socket options of an actor's PUSH and a replay shard's
# PULL (Role.open_push / open_pull), zrl Messages through Channels on both ends.
STREAM_END = r"""
import json, os, sys, time
import numpy as np
import zmq
from zrl.config.sections import DEFAULT_STREAMS, BrokerConfig
from zrl.transport import protocol as P
from zrl.transport.security import load_keys
from zrl.transport.endpoints import broker_endpoints
from zrl.transport.sockets import Channel, TransportStats, make_socket

side, broker, keydir = sys.argv[1], sys.argv[2], sys.argv[3]
size, seconds = int(sys.argv[4]), float(sys.argv[5])
keys = load_keys(keydir) if keydir != "-" else None
eps = broker_endpoints(broker, list(DEFAULT_STREAMS))
kbuf = BrokerConfig().stream_buffer_bytes
ctx = zmq.Context()
if side == "push":
    sock = make_socket(
        ctx, zmq.PUSH, sndhwm=2, sndtimeo_ms=100, kernel_buffer_bytes=kbuf, keys=keys
    )
    sock.connect(eps["experience_in"])
    ch = Channel(sock, "experience", "bench-producer", TransportStats())
    # First a tiny one-frame message: with CURVE, the first message on a connection is what
    # carries the client's ZAP credential to the device, and a large multipart one kills the
    # device (zmq_proxy EAGAIN; see the zrl bug report). The consumer skips it.
    while not ch.send(P.Message("prime")):
        pass
    payload = np.ones(size, np.uint8)
    while True:
        ch.send(P.Message(P.TRAJECTORY, arrays={"x": payload}))
else:
    sock = make_socket(
        ctx, zmq.PULL, rcvhwm=2, rcvtimeo_ms=100, kernel_buffer_bytes=kbuf, keys=keys
    )
    sock.connect(eps["experience_out"])
    ch = Channel(sock, "experience", "bench-consumer", TransportStats())
    deadline = time.monotonic() + 30.0
    first = None
    while first is None and time.monotonic() < deadline:
        got = ch.recv()
        if got is not None and got[1].kind == P.TRAJECTORY:
            first = time.monotonic()
    if first is None:
        print(json.dumps({"error": "no message within 30 s"}))
        sys.exit(0)
    while time.monotonic() < first + 1.0:  # warm up
        ch.recv()
    n, nbytes, t0 = 0, 0, time.monotonic()
    while (now := time.monotonic()) < t0 + seconds:
        got = ch.recv()
        if got is not None:
            n += 1
            nbytes += got[1].nbytes
    elapsed = time.monotonic() - t0
    print(json.dumps({"msgs": n, "bytes": nbytes, "seconds": elapsed, "dropped": ch.stats.dropped}))
"""


def log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="zrl-bench-multihost-"))


# --- (A) actors across namespaces ------------------------------------------------------------


class Status:
    """The poller's JSON lines: the newest status, and heartbeat-timed counters."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def latest(self) -> dict[str, Any] | None:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
        return None

    def records(self) -> list[dict[str, Any]]:
        """Every status the poller wrote, oldest first."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the line being written
                continue
        return out

    def actor_rows(self, pids: set[int]) -> tuple[float, dict[int, dict[str, Any]]] | None:
        st = self.latest()
        if st is None:
            return None
        return st["t"], {r["pid"]: r for r in st["roles"] if r["pid"] in pids}


def heartbeat_steps(t: float, row: dict[str, Any]) -> tuple[float, int]:
    """(time of the heartbeat that carried the figures, env steps)."""
    return t - float(row["age"]), int(row["info"].get("env_steps", 0))


def signal_all(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)


def wait_stepping(status: Status, procs: list[subprocess.Popen[bytes]], logs: Path) -> str | None:
    """Wait until every actor of ``procs`` is registered and stepping; an error, or None."""
    pids = {p.pid for p in procs}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        got = status.actor_rows(pids)
        if got and len(got[1]) == len(pids):
            if all(r["info"].get("env_steps", 0) > 0 for r in got[1].values()):
                return None
        if any(p.poll() is not None for p in procs):
            return f"an actor exited (logs in {logs})"
        time.sleep(POLL_S)
    return f"actors not stepping after {START_TIMEOUT_S:g}s (logs in {logs})"


def measure_pair(
    hosts: Hosts,
    status: Status,
    broker: str,
    n: int,
    first_index: int,
    seconds: float,
    windows: int,
    logs: Path,
) -> dict[str, dict[str, Any]]:
    """n actors in h0 (local) and one in each of h1..hn (remote), started together; then only
    one set runs at a time (the other is SIGSTOPped), alternating ``windows`` times, so both
    see the same machine load. Each set's rate: sum over its actors of steps / heartbeat time."""
    sets: dict[str, list[subprocess.Popen[bytes]]] = {"local": [], "remote": []}
    idx = first_index
    for mode, where in (("local", [0] * n), ("remote", list(range(1, n + 1)))):
        for host in where:
            sets[mode].append(
                hosts.zrl(
                    host,
                    "start",
                    "actor",
                    "--broker",
                    broker,
                    "--index",
                    str(idx),
                    log=logs / f"actor-{idx}-h{host}.log",
                )
            )
            idx += 1
    try:
        error = wait_stepping(status, sets["local"] + sets["remote"], logs)
        if error:
            return {mode: {"error": error} for mode in sets}
        steps = {p.pid: 0 for procs in sets.values() for p in procs}
        windows_log: list[tuple[str, int, float]] = []
        spent = dict.fromkeys(steps, 0.0)
        for _ in range(windows):
            for mode, other in (("local", "remote"), ("remote", "local")):
                signal_all(sets[other], signal.SIGSTOP)
                signal_all(sets[mode], signal.SIGCONT)
                time.sleep(WARMUP_S)  # resume, refill the pipeline, heartbeat
                pids = {p.pid for p in sets[mode]}
                t0, rows0 = status.actor_rows(pids) or (0.0, {})
                time.sleep(seconds / windows)
                t1, rows1 = status.actor_rows(pids) or (0.0, {})
                for pid in pids:
                    if pid not in rows0 or pid not in rows1:
                        return {m: {"error": f"actor pid {pid} missing from status"} for m in sets}
                    (ta, sa), (tb, sb) = (
                        heartbeat_steps(t0, rows0[pid]),
                        heartbeat_steps(t1, rows1[pid]),
                    )
                    steps[pid] += sb - sa
                    spent[pid] += tb - ta
                    windows_log.append((mode, pid, (sb - sa) / (tb - ta) if tb > ta else 0.0))
        out = {}
        for mode, procs in sets.items():
            per = [steps[p.pid] / spent[p.pid] if spent[p.pid] > 0 else 0.0 for p in procs]
            out[mode] = {
                "steps_per_s": sum(per),
                "per_actor": per,
                "windows": [round(r) for m, _, r in windows_log if m == mode],
            }
        return out
    finally:
        signal_all(sets["local"] + sets["remote"], signal.SIGCONT)
        kill_procs(sets["local"] + sets["remote"])


def part_a(
    hosts: Hosts, counts: list[int], seconds: float, windows: int, logs: Path
) -> list[dict[str, Any]]:
    broker = f"tcp://{hosts.addrs[0]}:5555"
    # A paused actor misses heartbeats; a long timeout keeps it from being marked dead.
    hosts.zrl(
        0,
        "start",
        "broker",
        "--bind",
        broker,
        "--config",
        str(CONFIG),
        "--insecure",
        "--set",
        "replay.samples_per_insert=0",
        "--set",
        "broker.heartbeat_timeout=120",
        log=logs / "broker-a.log",
    )
    hosts.zrl(0, "start", "replay", "--broker", broker, log=logs / "replay-a.log")
    status_file = logs / "status-a.jsonl"
    (logs / "poller.py").write_text(POLLER)
    hosts.exec(
        0,
        sys.executable,
        str(logs / "poller.py"),
        broker,
        str(POLL_S),
        str(status_file),
        log=logs / "poller.log",
    )
    status = Status(status_file)
    results = []
    next_index = 0
    for n in counts:
        print(f"  {n} actor(s) local + {n} remote, alternating ...", flush=True)
        res = measure_pair(hosts, status, broker, n, next_index, seconds, windows, logs)
        next_index += 2 * n
        results += [{"actors": n, "mode": mode, **r} for mode, r in res.items()]
    return results


# --- (B) CurveZMQ on the experience stream -----------------------------------------------------


def stream_run(
    hosts: Hosts, broker: str, keys: Path | None, size: int, seconds: float, logs: Path, tag: str
) -> dict[str, Any]:
    """One producer (h1) and one consumer (h2) through ``broker``; the consumer's figures."""
    script = logs / "stream_end.py"
    kd = str(keys) if keys is not None else "-"
    out = logs / f"consumer-{tag}.json"
    consumer = hosts.exec(
        2, sys.executable, str(script), "pull", broker, kd, str(size), str(seconds), log=out
    )
    producer = hosts.exec(
        1,
        sys.executable,
        str(script),
        "push",
        broker,
        kd,
        str(size),
        str(seconds),
        log=logs / f"producer-{tag}.log",
    )
    try:
        consumer.wait(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return {"error": "consumer did not finish"}
    finally:
        kill_procs([producer, consumer])
    text = out.read_text().strip().splitlines()
    return json.loads(text[-1]) if text else {"error": f"no output (see {out})"}


def part_b(
    hosts: Hosts, size: int, seconds: float, rounds: int, logs: Path
) -> list[dict[str, Any]]:
    keys = logs / "keys"
    subprocess.run(
        [sys.executable, "-m", "zrl", "keys", "init", str(keys)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    (logs / "stream_end.py").write_text(STREAM_END)
    brokers = {"insecure": f"tcp://{hosts.addrs[0]}:7000", "secure": f"tcp://{hosts.addrs[0]}:6000"}
    blogs = {mode: logs / f"broker-b-{mode}.log" for mode in brokers}
    procs = [
        hosts.zrl(
            0, "start", "broker", "--bind", brokers["insecure"], "--insecure", log=blogs["insecure"]
        ),
        hosts.zrl(
            0,
            "start",
            "broker",
            "--bind",
            brokers["secure"],
            "--keys",
            str(keys),
            log=blogs["secure"],
        ),
    ]
    results = []
    try:
        for r in range(rounds):
            for mode in ("insecure", "secure"):
                print(f"  round {r + 1}, {mode} ...", flush=True)
                res = stream_run(
                    hosts,
                    brokers[mode],
                    keys if mode == "secure" else None,
                    size,
                    seconds,
                    logs,
                    f"{mode}-{r}",
                )
                if "Exception in thread zrl-device-" in blogs[mode].read_text(errors="replace"):
                    res["device_died"] = True
                results.append({"round": r + 1, "mode": mode, **res})
    finally:
        kill_procs(procs)
    return results


# --- (D) weights fanned out per host ------------------------------------------------------------

# h0's publisher: one version per ``go-<v>`` file in CTL, each printed with its send time.
WEIGHTS_PUB = r"""
import json, os, sys, time
import numpy as np
import zmq
from zrl.config.sections import DEFAULT_STREAMS
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints
from zrl.transport.sockets import Channel, TransportStats, make_socket

broker, mib, ctl = sys.argv[1], float(sys.argv[2]), sys.argv[3]
eps = broker_endpoints(broker, list(DEFAULT_STREAMS))
ctx = zmq.Context()
sock = make_socket(ctx, zmq.PUB, sndhwm=100, max_message_bytes=2**27)
sock.connect(eps["topics_in"])
ch = Channel(sock, "weights", "params-0", TransportStats(), topics=True, max_message_bytes=2**27)
w = np.ones(int(mib * 2**20) // 4, np.float32)
v = 0
while True:
    if not os.path.exists(os.path.join(ctl, f"go-{v + 1}")):
        time.sleep(0.002)
        continue
    v += 1
    t = time.time()
    ch.send(P.Message(P.WEIGHTS, meta={"version": v}, arrays={"w": w}), topic=P.WEIGHTS_TOPIC)
    print(json.dumps({"v": v, "t": t}), flush=True)
"""

# One host's F subscribers (SUBs as WeightsFollower opens them), on the bus or on the relay.
WEIGHTS_SUBS = r"""
import json, sys, time
import zmq
from zrl.config.sections import DEFAULT_STREAMS
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints, connect_topics
from zrl.transport.sockets import make_socket

mode, source, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = zmq.Context()
poller = zmq.Poller()
for _ in range(n):
    s = make_socket(ctx, zmq.SUB, rcvtimeo_ms=100, max_message_bytes=2**27)
    s.setsockopt(zmq.SUBSCRIBE, P.WEIGHTS_TOPIC.encode())
    if mode == "relay":
        s.connect(source)
    else:
        connect_topics(s, broker_endpoints(source, list(DEFAULT_STREAMS)))
    poller.register(s, zmq.POLLIN)
seen = {}
while True:
    for s, _ in poller.poll(1000):
        frames = s.recv_multipart(copy=False)
        t = time.time()
        v = P.decode(frames[1:]).meta["version"]
        seen.setdefault(v, []).append(t)
        if len(seen[v]) == n:
            print(json.dumps({"v": v, "last": max(seen.pop(v))}), flush=True)
"""

# One host's relay: the host agent's WeightsRelay, alone in a process.
WEIGHTS_RELAY = r"""
import json, sys, tempfile, time
from pathlib import Path
import zmq
from zrl.config.sections import DEFAULT_STREAMS, BrokerConfig
from zrl.run.weights_relay import WeightsRelay
from zrl.transport.endpoints import broker_endpoints

eps = broker_endpoints(sys.argv[1], list(DEFAULT_STREAMS))
relay = WeightsRelay(
    zmq.Context(),
    eps,
    Path(tempfile.mkdtemp(prefix="zrl-bench-relay-")),
    max_message_bytes=BrokerConfig().max_topic_message_bytes,
)
relay.start()
print(json.dumps({"endpoint": relay.endpoint}), flush=True)
while relay.alive():
    time.sleep(1.0)
    print(json.dumps({"relayed": relay.relayed, "superseded": relay.superseded}), flush=True)
"""


def json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def tx_bytes(hosts: Hosts, host: int) -> int:
    """Bytes the host's eth0 has sent."""
    done = hosts.run(host, "ip", "-s", "-j", "link", "show", "eth0", check=True)
    return int(json.loads(done.stdout)[0]["stats64"]["tx"]["bytes"])


def arrivals(logs: list[Path], v: int) -> list[float] | None:
    """Each host's last receipt of version ``v``, or None while a host lacks it."""
    lasts = []
    for log in logs:
        got = [r["last"] for r in json_lines(log) if r.get("v") == v]
        if not got:
            return None
        lasts.append(got[0])
    return lasts


def wait_json(path: Path, key: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in json_lines(path):
            if key in r:
                return r
        time.sleep(0.05)
    raise RuntimeError(f"no {key!r} in {path} within {timeout:g}s")


def relay_run(
    hosts: Hosts,
    mode: str,
    broker: str,
    shape: tuple[int, int, int],
    ctl: Path,
    next_v: int,
    logs: Path,
) -> tuple[dict[str, Any], int]:
    """One mode (``direct`` or ``relay``) of ``shape`` (hosts, subscribers per host, measured
    versions): warm-up, then the measured versions; the figures and the next version."""
    n_hosts, followers, versions = shape
    procs: list[subprocess.Popen[bytes]] = []
    sub_logs = []
    try:
        for h in range(1, n_hosts + 1):
            source = broker
            if mode == "relay":
                rlog = logs / f"relay-h{h}.log"
                procs.append(
                    hosts.exec(h, sys.executable, str(logs / "relay.py"), broker, log=rlog)
                )
                source = wait_json(rlog, "endpoint", START_TIMEOUT_S)["endpoint"]
            sub_logs.append(logs / f"subs-{mode}-h{h}.log")
            cmd = [sys.executable, str(logs / "subs.py"), mode, source, str(followers)]
            procs.append(hosts.exec(h, *cmd, log=sub_logs[-1]))

        def publish(v: int, timeout: float) -> list[float] | None:
            (ctl / f"go-{v}").touch()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                lasts = arrivals(sub_logs, v)
                if lasts is not None:
                    return lasts
                time.sleep(0.01)
            return None

        # Warm-up: versions until one reaches every subscriber (all have subscribed).
        for _ in range(60):
            got = publish(next_v, 5.0)
            next_v += 1
            if got is not None:
                break
        else:
            return {"mode": mode, "error": "no version reached every subscriber"}, next_v
        rows: list[dict[str, Any]] = []
        for _ in range(versions):
            before = tx_bytes(hosts, 0)
            lasts = publish(next_v, 120.0)
            after = tx_bytes(hosts, 0)
            sent = [r["t"] for r in json_lines(logs / "pub.log") if r.get("v") == next_v]
            if lasts is None or not sent:
                rows.append({"v": next_v, "missing": True})
            else:
                rows.append({"v": next_v, "bytes": after - before, "latency": max(lasts) - sent[0]})
            next_v += 1
        return {"mode": mode, "rows": rows}, next_v
    finally:
        kill_procs(procs)


def part_d(
    hosts: Hosts, n_hosts: int, followers: int, mib: float, versions: int, logs: Path
) -> list[dict[str, Any]]:
    (logs / "pub.py").write_text(WEIGHTS_PUB)
    (logs / "subs.py").write_text(WEIGHTS_SUBS)
    (logs / "relay.py").write_text(WEIGHTS_RELAY)
    ctl = logs / "ctl"
    ctl.mkdir()
    broker = f"tcp://{hosts.addrs[0]}:7400"
    pub = [sys.executable, str(logs / "pub.py"), broker, str(mib), str(ctl)]
    procs = [
        hosts.zrl(0, "start", "broker", "--bind", broker, "--insecure", log=logs / "broker-d.log"),
        hosts.exec(0, *pub, log=logs / "pub.log"),
    ]
    results = []
    next_v = 1
    try:
        for mode in ("direct", "relay"):
            print(f"  {mode}: {n_hosts} hosts x {followers} subscribers ...", flush=True)
            res, next_v = relay_run(
                hosts, mode, broker, (n_hosts, followers, versions), ctl, next_v, logs
            )
            results.append(res)
    finally:
        kill_procs(procs)
    return results


def report_d(results: list[dict[str, Any]], n_hosts: int, followers: int, mib: float) -> None:
    size = mib * 2**20
    print(f"\n(D) {mib:g} MiB weights, {n_hosts} hosts x {followers} subscribers")
    print("| path | versions | broker egress per version | copies | to the last subscriber |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for res in results:
        name = "broker bus" if res["mode"] == "direct" else "relay per host"
        if "error" in res:
            print(f"| {name} | error: {res['error']} | | | |")
            continue
        ok = [r for r in res["rows"] if not r.get("missing")]
        if not ok:
            print(f"| {name} | 0 of {len(res['rows'])} | | | |")
            continue
        nbytes = statistics.median(r["bytes"] for r in ok)
        lat = sorted(r["latency"] for r in ok)
        print(
            f"| {name} | {len(ok)} of {len(res['rows'])} | {nbytes / 2**20:,.0f} MiB "
            f"| {nbytes / size:.1f} | {statistics.median(lat):.2f} s "
            f"(min {lat[0]:.2f}, max {lat[-1]:.2f}) |"
        )


# --- (C) actor hosts into one learner ---------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (all its threads), or None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)


def role_row(status: dict[str, Any], rid: str) -> dict[str, Any] | None:
    return next((r for r in status["roles"] if r["id"] == rid), None)


def heartbeat_time(status: dict[str, Any], row: dict[str, Any]) -> float:
    """When the heartbeat whose figures ``row`` shows arrived (status time minus row age)."""
    return float(status["t"]) - float(row["age"])


def first_step_time(records: list[dict[str, Any]]) -> float | None:
    """When the learner took its first step (its ``stepping_since``), from the first heartbeat
    that carries time shares: the midpoint between it and the heartbeat before, if seen."""
    before = None
    for rec in records:
        row = role_row(rec, "learner-0")
        if row is None:
            continue
        h = heartbeat_time(rec, row)
        if "wait_share" in row["info"]:
            return h if before is None else (before + h) / 2
        before = h
    return None


def window_shares(
    t0: float, h0: float, info0: dict[str, Any], h1: float, info1: dict[str, Any]
) -> dict[str, float]:
    """Each part's share of the learner's time between its heartbeats at ``h0`` and ``h1``.

    The heartbeat's ``<part>_share`` is cumulative since the first step at ``t0``, so the part
    took ``share * (h - t0)`` seconds by ``h``; the window's share is the difference over
    ``h1 - h0``. An error of d seconds in ``t0`` moves it by ``(share0 - share1) * d /
    (h1 - h0)``: a few thousandths for a heartbeat's d and a window of 20 s."""
    span = h1 - h0
    out = {}
    for key in SHARE_KEYS:
        if key in info0 and key in info1 and span > 0:
            spent = float(info1[key]) * (h1 - t0) - float(info0[key]) * (h0 - t0)
            out[key] = spent / span
    return out


def train_run(
    hosts: Hosts,
    n: int,
    port: int,
    config: Path,
    overrides: list[str],
    seconds: float,
    warmup: float,
    logs: Path,
) -> dict[str, Any]:
    """One APPO run: broker, replay, params and learner in h0, one actor in each of h1..hn.
    Its figures over ``seconds``, ``warmup`` s after every actor steps and the learner
    updates; every process of the run is killed before it returns."""
    broker = f"tcp://{hosts.addrs[0]}:{port}"
    tag = f"c{n}-{port}"
    sets = [arg for o in overrides for arg in ("--set", o)]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    procs["broker"] = hosts.zrl(
        0,
        "start",
        "broker",
        "--bind",
        broker,
        "--config",
        str(config),
        "--insecure",
        # On two loaded cores a role may miss beats at start; this is not what is measured.
        "--set",
        "broker.heartbeat_timeout=30",
        *sets,
        log=logs / f"broker-{tag}.log",
    )
    for role in ("replay", "params", "learner"):
        procs[role] = hosts.zrl(
            0, "start", role, "--broker", broker, log=logs / f"{role}-{tag}.log"
        )
    for i in range(n):
        procs[f"actor-{i}"] = hosts.zrl(
            i + 1,
            "start",
            "actor",
            "--broker",
            broker,
            "--index",
            str(i),
            log=logs / f"actor-{i}-h{i + 1}-{tag}.log",
        )
    status_file = logs / f"status-{tag}.jsonl"
    procs["poller"] = hosts.exec(
        0,
        sys.executable,
        str(logs / "poller.py"),
        broker,
        str(POLL_S),
        str(status_file),
        log=logs / f"poller-{tag}.log",
    )
    status = Status(status_file)
    actor_ids = [f"actor-{i}" for i in range(n)]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            st = status.latest()
            if st is not None:
                rows = {r["id"]: r for r in st["roles"]}
                stepping = all(
                    rows.get(a, {}).get("info", {}).get("env_steps", 0) > 0 for a in actor_ids
                )
                if stepping and rows.get("learner-0", {}).get("info", {}).get("updates", 0) > 0:
                    break
            exited = [name for name, p in procs.items() if p.poll() is not None]
            if exited:
                return {"error": f"{', '.join(exited)} exited (logs in {logs})"}
            if time.monotonic() > deadline:
                return {"error": f"not training after {START_TIMEOUT_S:g}s (logs in {logs})"}
            time.sleep(POLL_S)
        time.sleep(warmup)
        cpu0 = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        w0 = time.time()
        time.sleep(seconds)
        w1 = time.time()
        cpu1 = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        records = status.records()
        window = [r for r in records if w0 <= r["t"] <= w1]
        if len(window) < 2:
            return {"error": f"fewer than two status answers in the window (logs in {logs})"}
        first, last = window[0], window[-1]
        ids = ["learner-0", "replay-0", *actor_ids]
        rows0 = {rid: role_row(first, rid) for rid in ids}
        rows1 = {rid: role_row(last, rid) for rid in ids}
        missing = [rid for rid in ids if rows0[rid] is None or rows1[rid] is None]
        if missing:
            return {"error": f"{', '.join(missing)} missing from status (logs in {logs})"}
        per_actor = []
        for rid in actor_ids:
            a0, a1 = rows0[rid], rows1[rid]
            assert a0 is not None and a1 is not None
            (ta, sa), (tb, sb) = heartbeat_steps(first["t"], a0), heartbeat_steps(last["t"], a1)
            per_actor.append((sb - sa) / (tb - ta) if tb > ta else 0.0)
        l0, l1 = rows0["learner-0"], rows1["learner-0"]
        assert l0 is not None and l1 is not None
        h0, h1 = heartbeat_time(first, l0), heartbeat_time(last, l1)
        span = h1 - h0
        i0, i1 = l0["info"], l1["info"]
        t0 = first_step_time(records)
        fills = []
        for rec in window:
            rep = role_row(rec, "replay-0")
            if rep is not None and rep["info"].get("capacity"):
                fills.append(rep["info"]["size"] / rep["info"]["capacity"])

        def cores(names: list[str]) -> float:
            """CPU seconds per second of the named processes over the window."""
            used = 0.0
            for k in names:
                a, b = cpu0.get(k), cpu1.get(k)
                if a is not None and b is not None:
                    used += b - a
            return used / (w1 - w0)

        return {
            "actor_hosts": n,
            "steps_per_s": sum(per_actor),
            "per_actor": per_actor,
            "updates_per_s": (i1["updates"] - i0["updates"]) / span if span > 0 else 0.0,
            "samples_per_s": (
                (i1["samples_trained"] - i0["samples_trained"]) / span if span > 0 else 0.0
            ),
            "shares": window_shares(t0, h0, i0, h1, i1) if t0 is not None else {},
            "shares_cumulative": {k: i1[k] for k in i1 if k.endswith("_share")},
            "fifo_fill": sum(fills) / len(fills) if fills else float("nan"),
            "fifo_full": sum(f >= 1.0 for f in fills) / len(fills) if fills else float("nan"),
            "cores_learner": cores(["learner"]),
            "cores_actors": cores(actor_ids),
            "cores_other": cores(["broker", "replay", "params", "poller"]),
            "window_s": w1 - w0,
        }
    finally:
        kill_procs(list(procs.values()))


def part_c(
    hosts: Hosts,
    counts: list[int],
    config: Path,
    overrides: list[str],
    seconds: float,
    warmup: float,
    rounds: int,
    logs: Path,
) -> list[dict[str, Any]]:
    """Every count in turn, ``rounds`` times over (1, 2, 4, 1, 2, 4, ...), so a change in
    what else loads the machine falls on every count alike."""
    (logs / "poller.py").write_text(POLLER)
    results = []
    k = 0
    for r in range(rounds):
        for n in counts:
            print(f"  round {r + 1}, {n} actor host(s): training ...", flush=True)
            port = TRAIN_PORT + 100 * k
            res = train_run(hosts, n, port, config, overrides, seconds, warmup, logs)
            results.append({"round": r + 1, "actor_hosts": n, **res})
            k += 1
    return results


# --- report ------------------------------------------------------------------------------------


def report_a(results: list[dict[str, Any]]) -> None:
    print()
    print("(A) actor env steps/s: one actor per namespace (remote) vs all in the broker's (local)")
    print(
        f"{'actors':>6} {'local steps/s':>14} {'remote steps/s':>15} {'remote/local':>13}"
        f"  {'local windows (k/s)':<22} {'remote windows (k/s)':<22}"
    )
    by = {(r["actors"], r["mode"]): r for r in results}
    for n in sorted({r["actors"] for r in results}):
        loc, rem = by[(n, "local")], by[(n, "remote")]
        if "error" in loc or "error" in rem:
            print(f"{n:>6} error: {loc.get('error') or rem.get('error')}")
            continue
        ratio = rem["steps_per_s"] / loc["steps_per_s"] if loc["steps_per_s"] else float("nan")

        def spread(r: dict[str, Any]) -> str:
            # Per-window sums over the set's actors: how much the machine's load moved them.
            k = len(r["per_actor"])
            w = r["windows"]
            sums = [sum(w[i : i + k]) / 1000 for i in range(0, len(w), k)]
            return " ".join(f"{x:.0f}" for x in sums)

        print(
            f"{n:>6} {loc['steps_per_s']:>14,.0f} {rem['steps_per_s']:>15,.0f} {ratio:>13.2f}"
            f"  {spread(loc):<22} {spread(rem):<22}"
        )
    print(
        "(actors, replay and broker share this machine's cores, so more actors split the same "
        "CPUs; local and remote\n windows alternate, so both see the same load from anything "
        "else running)"
    )


def report_b(results: list[dict[str, Any]], size: int) -> None:
    print()
    print(
        f"(B) CurveZMQ on the experience stream: {size // 1024} KiB messages, "
        "h1 PUSH -> broker device in h0 -> h2 PULL (decoded)"
    )
    print(f"{'round':>5} {'mode':<9} {'msgs/s':>9} {'MiB/s':>8}  note")
    best: dict[str, float] = {}
    for r in results:
        if "error" in r:
            print(
                f"{r['round']:>5} {r['mode']:<9} {'error':>9}           {r['error']}"
                + ("; the broker's experience device died" if r.get("device_died") else "")
            )
            continue
        rate = r["msgs"] / r["seconds"]
        mib = r["bytes"] / r["seconds"] / 2**20
        note = "broker device thread DIED" if r.get("device_died") else ""
        print(f"{r['round']:>5} {r['mode']:<9} {rate:>9,.0f} {mib:>8,.1f}  {note}")
        best[r["mode"]] = max(best.get(r["mode"], 0.0), rate)
    if best.get("insecure"):
        ratio = best.get("secure", 0.0) / best["insecure"]
        verdict = "MET" if ratio >= TARGET_CURVE_RATIO else "NOT MET"
        print(
            f"secure/insecure (best rounds): {ratio:.2f}   target >= {TARGET_CURVE_RATIO}: "
            f"{verdict}"
        )
    else:
        print(
            f"secure/insecure: n/a (no insecure measurement)   target >= {TARGET_CURVE_RATIO}: "
            "NOT MET"
        )


def train_row(r: dict[str, Any], base: dict[str, Any] | None, label: str) -> str:
    """One line of the (C) table; ``x1`` columns against ``base``."""
    if "error" in r:
        return f"{label:>9} error: {r['error']}"

    def ratio(key: str) -> float:
        return r[key] / base[key] if base is not None and base.get(key) else float("nan")

    sh = r["shares"]
    pct = {k: f"{100 * sh[k]:.0f}%" if k in sh else "n/a" for k in SHARE_KEYS}
    return (
        f"{label:>9} {r['steps_per_s']:>11,.0f} {ratio('steps_per_s'):>5.2f} "
        f"{r['updates_per_s']:>9.1f} {ratio('updates_per_s'):>5.2f} {r['samples_per_s']:>9,.0f} "
        f"{pct['wait_share']:>5} {pct['copy_share']:>5} {pct['update_share']:>6} "
        f"{pct['publish_share']:>7} {100 * r['fifo_fill']:>8.0f}% "
        f"{100 * r['fifo_full']:>4.0f}% {r['cores_learner']:>14.2f} "
        f"{r['cores_actors']:>6.2f} {r['cores_other']:>5.2f}"
    )


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-field medians of a count's runs (of two: their mean)."""
    out: dict[str, Any] = {"shares": {}}
    for key in (
        "steps_per_s",
        "updates_per_s",
        "samples_per_s",
        "fifo_fill",
        "fifo_full",
        "cores_learner",
        "cores_actors",
        "cores_other",
    ):
        out[key] = statistics.median(r[key] for r in runs)
    for key in SHARE_KEYS:
        vals = [r["shares"][key] for r in runs if key in r["shares"]]
        if vals:
            out["shares"][key] = statistics.median(vals)
    return out


def report_c(results: list[dict[str, Any]], config: Path, overrides: list[str]) -> None:
    print()
    extra = f" {' '.join(overrides)}" if overrides else ""
    shown = config.relative_to(REPO) if config.is_relative_to(REPO) else config
    print(
        f"(C) actor hosts into one learner: {shown}{extra}; broker, replay (FIFO), params, "
        "learner in h0, one actor in each actor host"
    )
    print(
        f"{'hosts':>9} {'env steps/s':>11} {'x1':>5} {'updates/s':>9} {'x1':>5} "
        f"{'samples/s':>9} {'wait':>5} {'copy':>5} {'update':>6} {'publish':>7} "
        f"{'fifo fill':>9} {'full':>5} {'cores: learner':>14} {'actors':>6} {'rest':>5}"
    )
    rounds = sorted({r["round"] for r in results})
    for rnd in rounds:
        runs = [r for r in results if r["round"] == rnd]
        base = next((r for r in runs if "error" not in r), None)
        for r in runs:
            label = f"{r['actor_hosts']}" + (f" (r{rnd})" if len(rounds) > 1 else "")
            print(train_row(r, base, label))
    if len(rounds) > 1:
        medians = []
        for n in dict.fromkeys(r["actor_hosts"] for r in results):
            runs = [r for r in results if r["actor_hosts"] == n and "error" not in r]
            if runs:
                medians.append((n, median_run(runs)))
        for n, m in medians:
            print(train_row(m, medians[0][1], f"{n} median"))
    print(
        "(x1: against the first count (of the same round; medians against the first median); "
        "wait..publish:\n shares of the learner's time over the window; fifo fill: mean queue "
        "size / capacity over the status\n polls, full: share of polls that found it full; "
        "cores: CPU seconds per second of the learner,\n of all actors, of broker + replay + "
        "params + status poller)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=15.0,
        help="(A) measured seconds per configuration, over all its windows",
    )
    parser.add_argument("--windows", type=int, default=3, help="(A) alternations per count")
    parser.add_argument("--counts", default="1,2,4", help="(A) actor counts")
    parser.add_argument("--size", type=int, default=64 * 1024, help="(B) message bytes")
    parser.add_argument("--stream-seconds", type=float, default=4.0, help="(B) window per run")
    parser.add_argument("--rounds", type=int, default=2, help="(B) rounds of insecure+secure")
    parser.add_argument("--hosts", default="1,2,4", help="(C) actor host counts")
    parser.add_argument(
        "--config", type=Path, default=TRAIN_CONFIG, help="(C) the APPO run's config"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="(C) config override for every run, e.g. learner.device=cuda (repeatable)",
    )
    parser.add_argument(
        "--train-seconds", type=float, default=15.0, help="(C) measured seconds per run"
    )
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="(C) seconds skipped once a run trains"
    )
    parser.add_argument(
        "--train-rounds", type=int, default=2, help="(C) rounds of all counts, interleaved"
    )
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--skip-b", action="store_true")
    parser.add_argument("--skip-c", action="store_true")
    parser.add_argument("--relay", action="store_true", help="run (D), the weights relay")
    parser.add_argument("--relay-hosts", type=int, default=8, help="(D) hosts")
    parser.add_argument("--relay-followers", type=int, default=16, help="(D) subscribers/host")
    parser.add_argument("--weights-mib", type=float, default=10.0, help="(D) MiB per version")
    parser.add_argument("--relay-versions", type=int, default=5, help="(D) measured versions")
    args = parser.parse_args()
    ok, reason = netns_available()
    if not ok:
        print(f"cannot run: {reason}", file=sys.stderr)
        sys.exit(2)
    counts = [int(c) for c in args.counts.split(",")]
    host_counts = [int(c) for c in args.hosts.split(",")]
    if any(c < 1 for c in host_counts):
        parser.error(f"--hosts: counts of actor hosts are 1 or more, not {args.hosts!r}")
    config = args.config.resolve()
    if not config.is_file():
        parser.error(f"--config: no such file: {args.config}")

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through Hosts.__exit__: nothing is left behind

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    logs = log_dir()
    started = time.monotonic()
    load0 = f"{os.getloadavg()[0]:.1f}"
    print(f"zrl multi-host benchmark (logs in {logs})")
    needed = [3] if not args.skip_b else [1]
    needed += [1 + max(counts, default=0)] if not args.skip_a else []
    needed += [1 + max(host_counts, default=0)] if not args.skip_c else []
    needed += [1 + args.relay_hosts] if args.relay else []
    with Hosts(max(needed)) as hosts:
        print(
            f"hosts: {', '.join(f'{n}={a}' for n, a in zip(hosts.names, hosts.addrs, strict=True))}"
        )
        res_b = (
            [] if args.skip_b else part_b(hosts, args.size, args.stream_seconds, args.rounds, logs)
        )
        res_a = [] if args.skip_a else part_a(hosts, counts, args.seconds, args.windows, logs)
        res_c = (
            []
            if args.skip_c
            else part_c(
                hosts,
                host_counts,
                config,
                args.overrides,
                args.train_seconds,
                args.warmup,
                args.train_rounds,
                logs,
            )
        )
        res_d = (
            part_d(
                hosts,
                args.relay_hosts,
                args.relay_followers,
                args.weights_mib,
                args.relay_versions,
                logs,
            )
            if args.relay
            else []
        )
    if res_a:
        report_a(res_a)
    if res_b:
        report_b(res_b, args.size)
    if res_c:
        report_c(res_c, config, args.overrides)
    if res_d:
        report_d(res_d, args.relay_hosts, args.relay_followers, args.weights_mib)
    print(
        f"\n{time.monotonic() - started:.0f} s; load average {load0} at start, "
        f"{os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs); every process and namespace "
        "cleaned up"
    )


if __name__ == "__main__":
    main()
