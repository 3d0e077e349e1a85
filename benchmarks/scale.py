"""Scale benchmark: how much one broker carries, measured (issue 17, part 5).

Every section runs against a real broker process (``python -m zrl start broker --config
configs/cartpole_apex_dqn.yaml --no-preflight``) and real zrl sockets and messages:

(a) registry. N simulated roles (``--sizes``, default 10,100,1000), each with its OWN DEALER
    to the broker's ROUTER ``registry``, say HELLO as a role does (role ``actor``, a distinct
    index, host, pid, zrl_version), wait for their WELCOME, then send HEARTBEAT at ``--hz``
    (default 1) with an actor-like payload (five streams of counters and an actor's info),
    each answered HEARTBEAT_ACK. The roles run in worker processes of at most
    ``ROLES_PER_WORKER``, their heartbeats spread evenly over the second. Per N, over
    ``--seconds``: the first half heartbeats only, the second half with a probe client (its
    own DEALERs) asking STATUS, LOOKUP and HELLO in turn at ``--probe-hz``. Measured: the
    broker's CPU seconds per wall second (psutil, all its threads) in each half, its RSS, the
    probe's p50/p99 round trip per kind (send to reply received, decode not included), the
    STATUS reply's size (every role's row: it grows with N), and the heartbeat round trip
    the simulated roles see. Each N runs once per ``--per-agent`` value (default 0,100): 0,
    every role heartbeats itself; k, the roles are started by simulated host agents of k
    roles each (as ``zrl host`` starts them: each role's HELLO names its agent, and only the
    agents heartbeat, one message per agent per period carrying a report per role; the
    roles' own DEALERs stay connected and silent). STATUS is timed as a client asks it (one
    page), and the whole listing (every page, as ``zrl status`` and the head read it) once
    per row. Targets: 1,000 roles at 1 Hz cost < 10% of a core; registry p99 < 50 ms.
(b) weights broadcast. One 10 MiB WEIGHTS message (one uint8 array) published on topic
    ``weights`` (a PUB made as the parameter server makes it) through the broker's topic bus,
    bulk lane (``broker.bulk_topic_hwm`` = 8), to 1, 8, 64 and 256 subscribers (``--subs``;
    SUB sockets made as a role makes them, each its own connection, threads in at most
    ``SUB_WORKERS`` processes). Per broadcast: the time from publish until the last
    subscriber decoded it; the median over ``--broadcasts`` (after one warm-up), and the
    aggregate bytes/s. Derived target: the last subscriber has it within ``BROADCAST_TARGET_S``.
(c) experience fan-in. 64 simulated actors across 8 network namespaces (8 PUSH threads in one
    process per namespace) push trajectories on the broker's ``experience`` stream device
    as fast as back-pressure lets them; one PULL sink decodes and validates each (as a replay
    shard does, without inserting) and counts msgs/s and MB/s. Cases (``--fanin``): CartPole
    transitions of 32 steps x 8 envs (13 KB), Atari frame transitions of 32 steps x 8 envs
    (1.9 MB). Built with ``tests/integration/netns.py``: the broker and the sink run in a hub
    namespace, the actors in 8 more, all on one bridge in a namespace of its own; no address
    or interface of the root namespace is touched (the root namespace is shared). Derived
    targets: the demand of 64 actors at 10k (CartPole) or 1k (Atari) env steps/s each.
    Needs root and iproute2; skipped, saying why, otherwise.

Run from the repo root (about 4 minutes with the defaults)::

    python benchmarks/scale.py
    python benchmarks/scale.py --sections a --sizes 10,100 --seconds 6
    python benchmarks/scale.py --sections a --sizes 1000 --per-agent 0,100
    python benchmarks/scale.py --sections a --sizes 10000 --per-agent 100
    python benchmarks/scale.py --sections b --subs 1,8 --broadcasts 3

The machine is shared: every table is printed with the load average. Every process this
starts (broker, workers) is killed by PID on every way out (SIGTERM, SIGHUP, Ctrl-C, errors),
and dies with this one even if it is SIGKILLed (PR_SET_PDEATHSIG); every namespace is
deleted. Workers are this script re-run with ``--worker KIND``; they report over one ipc
PULL socket in a private temporary directory.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
sys.path.insert(0, str(REPO))  # tests.integration.netns, the namespace helpers

from tests.integration.netns import Hosts, kill_procs, netns_available  # noqa: E402
from zrl import __version__  # noqa: E402
from zrl.broker.limits import DropLog, info_fits  # noqa: E402
from zrl.broker.registry import REGISTRY_MAX_MESSAGE_BYTES, Registry, registry_socket  # noqa: E402
from zrl.config.sections import DEFAULT_STREAMS, MAX_ROLES, BrokerConfig  # noqa: E402
from zrl.roles.registry_client import read_status, registry_request  # noqa: E402
from zrl.run.host_agent import FIGURES_INTERVAL_S  # noqa: E402
from zrl.transport import protocol as P  # noqa: E402
from zrl.transport.endpoints import (  # noqa: E402
    broker_endpoints,
    connect_topics,
    free_port_range,
)
from zrl.transport.sockets import Channel, TransportStats, make_socket  # noqa: E402

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
BROKER_START_TIMEOUT_S = 30.0
BROKER_STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL: a broker removes its ipc directory as it stops
WARMUP_S = 2.0
REPORT_TIMEOUT_S = 30.0

# (a) registry
TARGET_ROLES = 1000
TARGET_CPU_FRACTION = 0.10  # of one core, at TARGET_ROLES roles heartbeating at 1 Hz
TARGET_P99_S = 0.050
ROLES_PER_WORKER = 250
AGENT_ROLES_PER_WORKER = 1000  # roles under simulated agents only register; their agents beat
FLOOR_MAX_ROLES = 2000  # the in-process floor is measured up to this many roles
REGISTER_TIMEOUT_S = 120.0
HELLO_RETRY_S = 5.0
PROBE_TIMEOUT_S = 5.0
RSS_SAMPLE_S = 0.5
ROLE_STREAMS = ("registry", "experience", "weights", "acks", "metrics")  # an actor's channels
SUPERVISOR_STATUS_TIMEOUT_S = 0.5  # zrl run's supervisor asks STATUS once a second with this

# (b) weights broadcast
WEIGHTS_BYTES = 10 * 2**20
SUB_WORKERS = 8
BROADCAST_WARMUP = 1
BROADCAST_TIMEOUT_S = 60.0
PING_BYTES = 80 * 1024  # over broker.small_topic_message_bytes: the ping takes the bulk lane
BROADCAST_TARGET_S = 1.0  # a learner publishes about once a second: one version in flight

# (c) experience fan-in
FANIN_NAMESPACES = 8
ACTORS_PER_NAMESPACE = 8
PROGRESS_S = 0.5
FANIN_CASES: dict[str, dict[str, Any]] = {
    # T steps x E envs per message; env steps/s per actor the derived target assumes.
    "cartpole": {"T": 32, "E": 8, "obs": (4,), "steps_per_s": 10_000},
    "atari": {"T": 32, "E": 8, "frames": (84, 84), "stack": 4, "steps_per_s": 1_000},
}


# --- processes -------------------------------------------------------------------------


def die_with_parent() -> None:
    """Runs in a child before exec: SIGTERM it when this process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """A process's CPU seconds by thread: ``main`` (the broker's registry loop runs in its
    main thread), ``io`` (libzmq's I/O threads, ZMQbg/IO/*), ``other`` (devices, topic bus)."""
    out = {"main": 0.0, "io": 0.0, "other": 0.0}
    for t in proc.threads():
        try:
            with open(f"/proc/{proc.pid}/task/{t.id}/comm") as f:
                name = f.read().strip()
        except OSError:
            name = ""
        key = "main" if t.id == proc.pid else "io" if name.startswith("ZMQbg/IO") else "other"
        out[key] += t.user_time + t.system_time
    return out


class Workers:
    """Every process this benchmark starts, killed by PID in ``close()``, and the ipc PULL
    socket they report on (JSON objects with ``event`` and ``pid``)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ctx = zmq.Context()
        self.endpoint = f"ipc://{tmp}/report"
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(self.endpoint)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.backlog: list[dict[str, Any]] = []

    def popen(self, cmd: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / log_name, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                preexec_fn=die_with_parent,
            )
        self.procs.append(proc)
        return proc

    def start(
        self, kind: str, spec: dict[str, Any], *, hosts: Hosts | None = None, host: int = 0
    ) -> subprocess.Popen[bytes]:
        """This script as a ``kind`` worker (in a namespace of ``hosts``, if given)."""
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--worker",
            kind,
            "--spec",
            json.dumps({**spec, "report": self.endpoint}),
        ]
        name = f"{kind}-{len(self.procs)}.log"
        if hosts is None:
            return self.popen(cmd, name)
        proc = hosts.exec(host, *cmd, log=self.tmp / name)
        self.procs.append(proc)
        return proc

    def wait_for(
        self,
        match: Callable[[dict[str, Any]], bool],
        count: int,
        timeout: float,
        watch: list[subprocess.Popen[bytes]] | None = None,
    ) -> list[dict[str, Any]]:
        """``count`` reports that ``match`` (earlier unmatched ones first), within ``timeout``;
        RuntimeError if a watched process exits first or the time runs out."""
        got = [r for r in self.backlog if match(r)][:count]
        for r in got:
            self.backlog.remove(r)
        deadline = time.monotonic() + timeout
        while len(got) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"{len(got)} of {count} reports within {timeout:g}s (worker logs in {self.tmp})"
                )
            if self.pull.poll(int(min(left, 0.5) * 1000)):
                r = self.recv()
                (got if match(r) else self.backlog).append(r)
            elif watch and any(p.poll() is not None for p in watch):
                raise RuntimeError(f"a worker exited early (logs in {self.tmp})")
        return got

    def recv(self) -> dict[str, Any]:
        r = self.pull.recv_json()
        if not isinstance(r, dict):
            raise RuntimeError(f"a worker reported {r!r}")
        return r

    def take(self, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Every report received so far that matches (the rest stay in the backlog)."""
        while self.pull.poll(0):
            self.backlog.append(self.recv())
        got = [r for r in self.backlog if match(r)]
        self.backlog = [r for r in self.backlog if not match(r)]
        return got

    def stop(self, procs: list[subprocess.Popen[bytes]], final: str | None = None) -> list[Any]:
        """SIGTERM ``procs``; their ``final`` reports (one each) if asked; then killed by PID."""
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        reports: list[Any] = []
        try:
            if final is not None:
                pids = {p.pid for p in procs}

                def match(r: dict[str, Any]) -> bool:
                    return r["event"] == final and r["pid"] in pids

                try:
                    reports = self.wait_for(match, len(procs), REPORT_TIMEOUT_S)
                except RuntimeError:  # one died without its report: what came
                    reports = self.take(match)
        finally:
            kill_procs(procs, grace=5.0)
        return reports

    def close(self) -> None:
        kill_procs(self.procs, grace=3.0)
        self.pull.close(linger=0)
        self.ctx.term()


BROKER_START_ATTEMPTS = 3
BROKER_EARLY_EXIT_S = 3.0
"""A broker still running this long after its start has bound its ports."""


def n_endpoints() -> int:
    return len(broker_endpoints("tcp://127.0.0.1:1", list(DEFAULT_STREAMS)))


@contextmanager
def local_broker(workers: Workers, *overrides: str) -> Iterator[tuple[str, psutil.Process]]:
    """A broker process on loopback (``python -m zrl start broker``): its address and
    process; stopped by PID on the way out. A broker that exits at once is started again on
    other ports, twice at most: between choosing free ports and binding them another process
    (a parallel test) may take one."""
    for attempt in range(BROKER_START_ATTEMPTS):
        addr = f"tcp://127.0.0.1:{free_port_range(n_endpoints())}"
        cmd = [
            sys.executable,
            "-m",
            "zrl",
            "start",
            "broker",
            "--bind",
            addr,
            "--config",
            str(CONFIG),
            "--no-preflight",
        ]
        for o in overrides:
            cmd += ["--set", o]
        proc = workers.popen(cmd, f"broker-{addr.rsplit(':', 1)[1]}.log")
        try:
            proc.wait(timeout=BROKER_EARLY_EXIT_S)
        except subprocess.TimeoutExpired:
            break  # still up: it bound its ports
        if attempt + 1 == BROKER_START_ATTEMPTS:
            raise RuntimeError(f"the broker exited with {proc.returncode} (logs in {workers.tmp})")
    try:
        ctx: zmq.Context = zmq.Context.instance()
        deadline = time.monotonic() + BROKER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the broker exited with {proc.returncode} (logs in {workers.tmp})"
                )
            try:
                registry_request(ctx, addr, P.Message(P.STATUS), timeout=0.5)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("the broker did not answer STATUS within 30 s") from None
        yield addr, psutil.Process(proc.pid)
    finally:
        kill_procs([proc], grace=BROKER_STOP_GRACE_S)


# --- (a) registry: simulated roles ----------------------------------------------------------


def actor_heartbeat(rid: str, beat: int) -> P.Message:
    """A heartbeat shaped like an Ape-X actor's: per-stream counters and its info."""
    stats = {
        s: {"sent": 40 * beat, "received": 39 * beat, "dropped": 0, "gaps": 0} for s in ROLE_STREAMS
    }
    steps = 512 * beat
    info = {
        "env_steps": steps,
        "episodes": steps // 200,
        "weights_version": beat // 2,
        "in_flight": 3,
        "ack_timeouts": 0,
        "env_errors": 0,
        "non_finite_env": 0,
        "trajectories_sent": steps // 256,
        "trajectories_delivered": steps // 256 - 3,
        "trajectories_lost": 0,
        "trajectories_late": 0,
        "steps_sent": steps,
        "steps_delivered": steps - 768,
        "steps_lost": 0,
        "steps_late": 0,
        "epsilon": 0.0123,
        "episode_return": 187.25,
        "rss_mb": 412.7,
    }
    return P.Message(
        P.HEARTBEAT,
        meta=P.plain_meta({"id": rid, "state": "running", "stats": stats, "info": info}),
    )


def agent_heartbeat(
    aid: str, rids: list[str], beat: int, max_info_bytes: int, figures: bool = True
) -> P.Message:
    """A host agent's heartbeat: its own figures (its children listed as ``zrl host`` lists
    them, cut to the info limit) and a report per role, each shaped like an actor's (with
    ``figures``; else its id alone, as ``zrl host`` sends between FIGURES_INTERVAL_S)."""
    actor = actor_heartbeat("", beat).meta
    children = [
        {"id": r, "pid": 10_000 + j, "state": "running", "restarts": 0, "log": f"/l/{r}.log"}
        for j, r in enumerate(rids)
    ]
    info: dict[str, Any] = {"log_dir": "/l", "children": children, "rss_mb": 80.5}
    while not info_fits(info, max_info_bytes - 64) and children:  # as zrl host's fit_info
        children.pop()
        info["children_omitted"] = len(rids) - len(children)
    reports = [
        {"id": r, "stats": actor["stats"], "info": actor["info"]} if figures else {"id": r}
        for r in rids
    ]
    return P.Message(
        P.HEARTBEAT,
        meta={"id": aid, "state": "running", "stats": {}, "info": info, "roles": reports},
    )


def sim_worker(spec: dict[str, Any], stop: threading.Event, report: Callable[..., None]) -> None:
    """``count`` simulated roles, each its own DEALER: HELLO, then HEARTBEAT at ``hz``. With
    ``per_agent`` (k), the roles are started by simulated host agents of k roles each (role
    ``host``, host ``sim-agent-<a>``, registered first): each role's HELLO names its agent,
    and only the agents heartbeat, each for its k roles (the roles' DEALERs stay connected).

    Reports ``registered`` once every role has its WELCOME (or the time ran out), and ``done``
    at SIGTERM with every heartbeat's send time and round trip."""
    broker, first, count, hz = spec["broker"], spec["first"], spec["count"], spec["hz"]
    k = spec.get("per_agent", 0)
    n_agents = count // k if k else 0
    ctx = zmq.Context()

    def dealers(n: int) -> list[Channel]:
        chans = []
        for _ in range(n):
            sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=0, sndtimeo_ms=0)
            sock.connect(broker)
            chans.append(Channel(sock, "registry", "actor", TransportStats()))
        return chans

    def replies(
        poller: zmq.Poller, index: dict[zmq.Socket, int], timeout_ms: float
    ) -> Iterator[tuple[int, P.Message]]:
        for sock, _ in poller.poll(int(timeout_ms)):
            while True:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                yield index[sock], P.decode(frames)

    def register(chans: list[Channel], meta: Callable[[int], dict[str, Any]]) -> list[str]:
        """HELLO on each channel (again every HELLO_RETRY_S until answered): the ids
        (``-`` refused, "" unanswered)."""
        poller, index = zmq.Poller(), {}
        for i, ch in enumerate(chans):
            poller.register(ch.sock, zmq.POLLIN)
            index[ch.sock] = i
        ids = [""] * len(chans)

        def hello(i: int) -> None:
            hello_meta = {"id": None, "pid": os.getpid(), "address": "127.0.0.1", "rpc": ""}
            hello_meta.update(meta(i), zrl_version=__version__)
            chans[i].send(P.Message(P.HELLO, meta=hello_meta), block=False)

        t0 = time.monotonic()
        for i in range(len(chans)):
            hello(i)
        answered, retry_at = 0, t0 + HELLO_RETRY_S
        while answered < len(chans) and not stop.is_set():
            now = time.monotonic()
            if now - t0 > REGISTER_TIMEOUT_S:
                break
            if now > retry_at:  # a role says HELLO again when no WELCOME came
                retry_at = now + HELLO_RETRY_S
                for i in range(len(chans)):
                    if not ids[i]:
                        hello(i)
            for i, msg in replies(poller, index, 100):
                if msg.kind == P.WELCOME and not ids[i]:
                    ids[i] = msg.meta["id"]
                    chans[i].sender = ids[i]
                    answered += 1
                    if k and msg.meta.get("agent") is None and meta(i)["role"] != "host":
                        refused.append("registered without its agent")
                elif msg.kind == P.REFUSED and not ids[i]:
                    ids[i] = "-"
                    answered += 1
                    refused.append(str(msg.meta.get("reason")))
        return ids

    def agent_host(a: int) -> str:
        return f"sim-agent-{spec['agent_first'] + a}"

    refused: list[str] = []
    t0 = time.monotonic()
    agent_chans = dealers(n_agents)
    agent_ids = register(
        agent_chans,
        lambda a: {"role": "host", "index": spec["agent_first"] + a, "host": agent_host(a)},
    )

    def role_meta(i: int) -> dict[str, Any]:
        if not k:
            return {"role": "actor", "index": first + i, "host": spec["host"]}
        return {
            "role": "actor",
            "index": first + i,
            "host": agent_host(i // k),
            "agent": agent_ids[i // k],
        }

    chans = dealers(count)
    ids = register(chans, role_meta)
    welcomed = sum(1 for rid in ids if rid and rid != "-")
    report(
        "registered",
        welcomed=welcomed,
        refused=refused[:3],
        n_refused=len(refused),
        seconds=time.monotonic() - t0,
    )
    if k:  # the agents heartbeat, each for its k roles
        beaters = agent_chans
        beater_ids = agent_ids
        info_limit = BrokerConfig().max_info_bytes

        every = max(1, round(hz * FIGURES_INTERVAL_S))  # the roles' figures once a second

        def beat(j: int, cycle: int) -> P.Message:
            rids = ids[j * k : (j + 1) * k]
            return agent_heartbeat(beater_ids[j], rids, cycle, info_limit, cycle % every == 0)
    else:
        beaters, beater_ids = chans, ids

        def beat(j: int, cycle: int) -> P.Message:
            return actor_heartbeat(beater_ids[j], cycle)

    poller, index = zmq.Poller(), {}
    for j, ch in enumerate(beaters):
        poller.register(ch.sock, zmq.POLLIN)
        index[ch.sock] = j
    count = len(beaters)

    # Heartbeats: role k of cycle c goes at start + (c + k / count) / hz, so the process
    # spreads its roles evenly over each period; an offset spreads the processes too.
    period = 1.0 / hz
    start = time.monotonic() + spec["offset"] * period
    cycle = b = 0
    pending: list[deque[float]] = [deque() for _ in range(count)]
    sent_t: list[float] = []
    rtt: list[float] = []
    sent = unknown = 0
    while not stop.is_set():
        now = time.monotonic()
        while (due := start + (cycle + b / count) * period) <= now:
            if beater_ids[b] and beater_ids[b] != "-":
                beaters[b].send(beat(b, cycle), block=False)
                pending[b].append(time.monotonic())
                sent += 1
            b += 1
            if b == count:
                b, cycle = 0, cycle + 1
        wait_ms = max(0.0, min(50.0, (due - time.monotonic()) * 1000))
        for i, msg in replies(poller, index, wait_ms):
            if msg.kind == P.HEARTBEAT_ACK and pending[i]:
                t_sent = pending[i].popleft()
                sent_t.append(t_sent)
                rtt.append(time.monotonic() - t_sent)
                unknown += len(msg.meta.get("unknown") or ())
            elif msg.kind == P.UNKNOWN_ROLE:
                unknown += 1
    for ch in [*agent_chans, *chans]:
        ch.close()
    ctx.term()
    report(
        "done",
        sent=sent,
        acked=len(rtt),
        unknown=unknown,
        t=[round(t, 6) for t in sent_t],
        rtt=[round(r, 6) for r in rtt],
        unacked=[round(t, 6) for q in pending for t in q],
    )


class Probe:
    """The probe client: one DEALER per request kind, one request in flight at a time."""

    KINDS = ("status", "lookup", "hello")
    REPLIES = {"status": P.STATUS_REPLY, "lookup": P.LOOKUP_REPLY, "hello": P.WELCOME}

    def __init__(self, ctx: zmq.Context, broker: str) -> None:
        self.chans = {}
        for kind in self.KINDS:
            sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=0)
            sock.connect(broker)
            self.chans[kind] = Channel(sock, "registry", "probe-0", TransportStats())
        self.requests = {
            "status": P.Message(P.STATUS),
            "lookup": P.Message(P.LOOKUP, meta={"role": "probe"}),
            "hello": P.Message(
                P.HELLO,
                meta={
                    "role": "probe",
                    "index": 0,
                    "host": "probe-host",
                    "pid": os.getpid(),
                    "rpc": "tcp://127.0.0.1:9",
                    "zrl_version": __version__,
                },
            ),
        }
        self.last_status: P.Message | None = None

    def ask(self, kind: str) -> tuple[float | None, int]:
        """(round trip: request sent to reply received, or None on timeout; reply bytes)."""
        ch = self.chans[kind]
        while ch.sock.poll(0):  # the late reply to a request that timed out
            ch.sock.recv_multipart()
        t0 = time.perf_counter()
        ch.send(self.requests[kind])
        if not ch.sock.poll(int(PROBE_TIMEOUT_S * 1000)):
            return None, 0
        frames = ch.sock.recv_multipart(copy=False)
        took = time.perf_counter() - t0
        reply = P.decode(frames)
        if reply.kind != self.REPLIES[kind]:
            raise RuntimeError(f"{kind}: the broker answered {reply.kind} {reply.meta}")
        if kind == "status":
            self.last_status = reply
        return took, sum(len(f) for f in frames)

    def close(self) -> None:
        for ch in self.chans.values():
            ch.close()


def observe(
    broker: psutil.Process, seconds: float, probe: Probe | None = None, probe_hz: float = 0.0
) -> dict[str, Any]:
    """The broker's CPU per wall second and peak RSS over ``seconds``; with ``probe``, the
    round trips of requests issued in turn at ``probe_hz``."""
    lat: dict[str, list[float]] = {k: [] for k in Probe.KINDS}
    timeouts = {k: 0 for k in Probe.KINDS}
    status_bytes = 0
    rss = broker.memory_info().rss
    th0 = thread_cpu(broker)
    c0, t0 = cpu_seconds(broker), time.monotonic()
    t_end = t0 + seconds
    next_probe = next_rss = t0
    n = 0
    while (now := time.monotonic()) < t_end:
        if probe is not None and now >= next_probe:
            kind = Probe.KINDS[n % len(Probe.KINDS)]
            n += 1
            took, nbytes = probe.ask(kind)
            if took is None:
                timeouts[kind] += 1
            else:
                lat[kind].append(took)
            if kind == "status" and nbytes:
                status_bytes = nbytes
            next_probe = max(next_probe + 1.0 / probe_hz, time.monotonic())
        if now >= next_rss:
            rss = max(rss, broker.memory_info().rss)
            next_rss += RSS_SAMPLE_S
        wake = min(next_rss, next_probe if probe is not None else t_end, t_end)
        time.sleep(max(0.0, wake - time.monotonic()))
    t1 = time.monotonic()
    th1 = thread_cpu(broker)
    return {
        "t0": t0,
        "t1": t1,
        "cpu": (cpu_seconds(broker) - c0) / (t1 - t0),
        "rss": rss,
        "threads": {k: (th1[k] - th0[k]) / (t1 - t0) for k in th0},
        "lat": lat,
        "timeouts": timeouts,
        "status_bytes": status_bytes,
    }


def pct(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def registry_floor(n: int, beats_per_role: int = 4, statuses: int = 5) -> dict[str, float]:
    """The registry loop's own CPU per heartbeat and per STATUS with ``n`` roles, in this
    process: a ``Registry`` serving its ROUTER over inproc, every message queued before it
    runs. No TCP, and no wake-up per message: the floor under what (a) measures live."""
    ctx = zmq.Context()
    router = registry_socket(ctx, REGISTRY_MAX_MESSAGE_BYTES, None)
    router.bind(f"inproc://zrl-scale-floor-{n}")
    ch = Channel(
        router,
        "registry",
        "broker@floor",
        TransportStats(),
        envelope=True,
        max_message_bytes=REGISTRY_MAX_MESSAGE_BYTES,
    )
    reg = Registry(
        ch,
        BrokerConfig(max_roles=2 * n + 64),
        drops=DropLog(),
        welcome=lambda rid: P.Message(P.WELCOME, meta={"id": rid}),
        broker_status=dict,
    )
    roles = []
    for i in range(n):
        sock = make_socket(ctx, zmq.DEALER, rcvhwm=100_000)
        sock.connect(f"inproc://zrl-scale-floor-{n}")
        roles.append(Channel(sock, "registry", f"actor-{i}", TransportStats()))

    def serve(expected: int) -> float:
        """Thread CPU seconds the registry takes to answer ``expected`` messages in all."""
        stop = threading.Event()

        def watch() -> None:
            while ch.stats.received < expected:
                time.sleep(0.001)
            stop.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.thread_time()
        reg.serve(stop)
        watcher.join()
        return time.thread_time() - t0

    try:
        for i, role in enumerate(roles):
            role.send(
                P.Message(
                    P.HELLO,
                    meta={
                        "role": "actor",
                        "index": i,
                        "host": "floor",
                        "pid": os.getpid(),
                        "zrl_version": __version__,
                    },
                )
            )
        serve(n)
        for role in roles:
            role.recv()
        for beat in range(beats_per_role):
            for i, role in enumerate(roles):
                role.send(actor_heartbeat(f"actor-{i}", beat))
        hb = serve(n + n * beats_per_role) / (n * beats_per_role)
        for _ in range(statuses):
            roles[0].send(P.Message(P.STATUS))
        status = serve(n + n * beats_per_role + statuses) / statuses
        frames = roles[0].sock.recv_multipart()
        while roles[0].sock.poll(0):
            frames = roles[0].sock.recv_multipart()
        return {"n": n, "heartbeat": hb, "status": status, "status_bytes": sum(map(len, frames))}
    finally:
        for role in roles:
            role.close()
        router.close(linger=0)
        ctx.term()


def registry_scale(
    workers: Workers, n: int, seconds: float, hz: float, probe_hz: float, per_agent: int = 0
) -> dict[str, Any]:
    """One row of (a): ``n`` simulated roles against a fresh broker; with ``per_agent``, the
    roles of simulated host agents of that many roles each (``n`` a multiple of it)."""
    if per_agent and n % per_agent:
        raise ValueError(f"{n} roles are no whole number of agents of {per_agent}")
    floor = registry_floor(n) if n <= FLOOR_MAX_ROLES else None
    roles_and_agents = n + (n // per_agent if per_agent else 0)
    max_roles = min(MAX_ROLES, max(BrokerConfig().max_roles, 2 * roles_and_agents + 64))
    with local_broker(workers, f"broker.max_roles={max_roles}") as (addr, broker):
        time.sleep(0.5)
        rss0 = broker.memory_info().rss
        cpu_idle = observe(broker, 1.0)["cpu"]
        # Whole agents per worker; an agent's roles only register, so a worker takes more.
        n_agents = n // per_agent if per_agent else 0
        per_worker = AGENT_ROLES_PER_WORKER if per_agent else ROLES_PER_WORKER
        n_workers = min(math.ceil(n / per_worker), n_agents or n)
        sims = []
        for w in range(n_workers):
            a0, a1 = n_agents * w // n_workers, n_agents * (w + 1) // n_workers
            first, last = (
                (a0 * per_agent, a1 * per_agent)
                if per_agent
                else (n * w // n_workers, n * (w + 1) // n_workers)
            )
            sims.append(
                workers.start(
                    "sim",
                    {
                        "broker": addr,
                        "first": first,
                        "count": last - first,
                        "hz": hz,
                        "host": f"sim-host-{w}",
                        "offset": w / n_workers,
                        "per_agent": per_agent,
                        "agent_first": a0,
                    },
                )
            )
        pids = {p.pid for p in sims}
        t_reg = time.monotonic()
        regs = workers.wait_for(
            lambda r: r["event"] == "registered" and r["pid"] in pids,
            n_workers,
            REGISTER_TIMEOUT_S + 30,
            sims,
        )
        register_s = time.monotonic() - t_reg
        welcomed = sum(r["welcomed"] for r in regs)
        refused = [reason for r in regs for reason in r["refused"]]
        probe = Probe(zmq.Context.instance(), addr)
        try:
            probe.ask("hello")  # registers probe-0 with an rpc endpoint, for LOOKUP to find
            time.sleep(WARMUP_S)
            sims_cpu0 = sum(cpu_seconds(psutil.Process(p.pid)) for p in sims)
            quiet = observe(broker, seconds / 2)
            sims_cpu = (sum(cpu_seconds(psutil.Process(p.pid)) for p in sims) - sims_cpu0) / (
                quiet["t1"] - quiet["t0"]
            )
            probed = observe(broker, seconds / 2, probe, probe_hz)
            rows = len(probe.last_status.meta["roles"]) if probe.last_status else 0
            t_all = time.perf_counter()  # every page, as `zrl status` and the head read them
            listed = len(read_status(zmq.Context.instance(), addr, 60.0)["roles"])
            status_all_s = time.perf_counter() - t_all
            time.sleep(WARMUP_S)  # the answers to the window's last heartbeats come in
        finally:
            probe.close()
        done = workers.stop(sims, final="done")
    t = np.concatenate([np.asarray(d["t"], float) for d in done])
    rtt = np.concatenate([np.asarray(d["rtt"], float) for d in done])
    unacked = np.concatenate([np.asarray(d["unacked"], float) for d in done])

    def rtts(w: dict[str, Any]) -> np.ndarray:
        return rtt[(t >= w["t0"]) & (t < w["t1"])]

    return {
        "n": n,
        "per_agent": per_agent,
        "welcomed": welcomed,
        "refused": refused,
        "register_s": register_s,
        "cpu_idle": cpu_idle,
        "cpu_hb": quiet["cpu"],
        "cpu_probe": probed["cpu"],
        "threads_hb": quiet["threads"],
        "threads_probe": probed["threads"],
        "sims_cpu": sims_cpu,
        "rss0": rss0,
        "rss": max(quiet["rss"], probed["rss"]),
        "status_bytes": probed["status_bytes"],
        "status_rows": rows,
        "status_all_s": status_all_s,
        "status_all_rows": listed,
        "lat": probed["lat"],
        "timeouts": probed["timeouts"],
        "hb_quiet": rtts(quiet),
        "hb_probed": rtts(probed),
        "hb_sent": sum(d["sent"] for d in done),
        "hb_acked": sum(d["acked"] for d in done),
        "hb_unacked": int(np.sum((unacked >= quiet["t0"]) & (unacked < probed["t1"]))),
        "hb_window": int(np.sum((t >= quiet["t0"]) & (t < probed["t1"]))),
        "unknown": sum(d["unknown"] for d in done),
        "load": load_average(),
        "floor": floor,
    }


def ms(x: float) -> str:
    return "   -" if math.isnan(x) else f"{x * 1e3:6.1f}"


def print_registry(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    half = args.seconds / 2
    print(
        f"\n(a) registry: N simulated roles (own DEALER each), HELLO then HEARTBEAT at "
        f"{args.hz:g} Hz (actor-like payload); {half:g} s heartbeats only, then {half:g} s "
        f"with a probe asking STATUS (its first page), LOOKUP, HELLO in turn at "
        f"{args.probe_hz:g} Hz. agent k: host agents of k roles each heartbeat for them (one "
        "message per agent per period); -: every role heartbeats itself"
    )
    print(
        f"{'N':>5} | {'agent':>5} | {'welcomed':>8} | {'register s':>10} | {'CPU idle':>8} | "
        f"{'CPU hb':>6} | {'hb loop/IO':>11} | {'CPU +probe':>10} | {'+probe loop/IO':>14} | "
        f"{'RSS MB':>6} | {'STATUS KB':>9} | {'load avg':>14}"
    )
    for r in rows:
        th, tp = r["threads_hb"], r["threads_probe"]
        print(
            f"{r['n']:>5} | {r['per_agent'] or '-':>5} | {r['welcomed']:>8} | "
            f"{r['register_s']:>10.2f} | "
            f"{r['cpu_idle']:>8.1%} | {r['cpu_hb']:>6.1%} | "
            f"{th['main']:>5.1%}/{th['io']:>5.1%} | {r['cpu_probe']:>10.1%} | "
            f"{tp['main']:>7.1%}/{tp['io']:>6.1%} | "
            f"{r['rss'] / 2**20:>6.1f} | {r['status_bytes'] / 1024:>9.1f} | "
            f"{r['load']:>14}"
        )
    print(
        f"{'N':>5} | {'agent':>5} | "
        + " | ".join(f"{k.upper() + ' p50/p99 ms':>19}" for k in Probe.KINDS)
        + f" | {'samples':>8} | {'HB ack p50/p99 ms':>17} | {'(with probe)':>13} | "
        f"{'unacked/acked':>13}"
    )
    for r in rows:
        lat = r["lat"]
        cells = " | ".join(
            f"{ms(pct(lat[k], 50))} / {ms(pct(lat[k], 99))}".rjust(19) for k in Probe.KINDS
        )
        n_s = "/".join(str(len(lat[k])) for k in Probe.KINDS)
        hq, hp = r["hb_quiet"], r["hb_probed"]
        print(
            f"{r['n']:>5} | {r['per_agent'] or '-':>5} | {cells} | {n_s:>8} | "
            f"{ms(pct(hq, 50))} / {ms(pct(hq, 99))}    | "
            f"{ms(pct(hp, 50))} / {ms(pct(hp, 99))} | {r['hb_unacked']:>6}/{r['hb_window']:<6}"
        )
        print(
            f"      the whole listing: {r['status_all_rows']} rows (every page) in "
            f"{r['status_all_s'] * 1e3:.0f} ms"
        )
        if r["refused"] or any(r["timeouts"].values()) or r["unknown"]:
            print(
                f"      refused: {r['refused']}  probe timeouts: {r['timeouts']}  "
                f"unknown_role: {r['unknown']}"
            )
    print(
        "      CPU: broker CPU seconds per wall second (1 core = 100%), all threads; loop/IO: "
        "its registry loop (main thread) and libzmq's I/O thread; RSS: peak; STATUS KB: "
        "one reply; unacked/acked: heartbeats sent in the window unanswered "
        f"{WARMUP_S:g} s after it / answered; "
        "load generator (sim workers) CPU in the heartbeat half: "
        + ", ".join(f"N={r['n']} {r['sims_cpu']:.0%}" for r in rows)
    )
    print(
        "      floor (the registry loop alone, in-process over inproc, messages queued, no "
        "wake-up per message): "
        + "; ".join(
            f"N={r['n']} {r['floor']['heartbeat'] * 1e6:.0f} µs/heartbeat, "
            f"{r['floor']['status'] * 1e3:.1f} ms/STATUS"
            for r in rows
            if r["floor"] is not None and not r["per_agent"]
        )
    )
    for per_agent in sorted({r["per_agent"] for r in rows}):
        mode = f"agents of {per_agent}" if per_agent else "roles heartbeating themselves"
        print(f"      {mode}:")
        registry_verdict([r for r in rows if r["per_agent"] == per_agent], args.hz)


def registry_verdict(rows: list[dict[str, Any]], hz: float) -> None:
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        per_role = (hi["cpu_hb"] - lo["cpu_hb"]) / (hi["n"] - lo["n"])
        status_per_role = (hi["status_bytes"] - lo["status_bytes"]) / (hi["n"] - lo["n"])
        rss_per_role = (hi["rss"] - hi["rss0"]) / hi["n"]
        st_lo, st_hi = pct(lo["lat"]["status"], 50), pct(hi["lat"]["status"], 50)
        st_per_role = (st_hi - st_lo) / (hi["n"] - lo["n"])
        print(
            f"      per role (slope N={lo['n']}..{hi['n']}): {per_role * 1e6:.0f} µs of broker "
            f"CPU per wall second at {hz:g} Hz ({per_role / hz * 1e6:.0f} µs per heartbeat), "
            f"{status_per_role:.0f} STATUS bytes, {rss_per_role / 1024:.1f} KiB RSS, "
            f"{st_per_role * 1e6:.1f} µs of STATUS p50"
        )
        if per_role > 0:
            print(
                f"      extrapolated: one core saturates at ~{1 / per_role:,.0f} roles at "
                f"{hz:g} Hz (~{1 / per_role * hz / 2:,.0f} at the shipped 2 Hz, "
                f"broker.heartbeat_interval 0.5 s); the 10% target holds to "
                f"~{TARGET_CPU_FRACTION / per_role:,.0f} roles at {hz:g} Hz"
            )
        if st_per_role > 0:
            print(
                f"      extrapolated: STATUS p50 passes zrl run's {SUPERVISOR_STATUS_TIMEOUT_S:g} s"
                f" timeout at ~{SUPERVISOR_STATUS_TIMEOUT_S / st_per_role:,.0f} roles, "
                f"50 ms at ~{TARGET_P99_S / st_per_role:,.0f}"
            )
    at = [r for r in rows if r["n"] >= TARGET_ROLES]
    if not at:
        print(f"      verdict: no row at N >= {TARGET_ROLES}; targets not checked")
        return
    r = at[0]
    cpu_ok = r["cpu_hb"] < TARGET_CPU_FRACTION
    p99 = {k: pct(r["lat"][k], 99) for k in Probe.KINDS}
    lat_ok = all(v < TARGET_P99_S for v in p99.values()) and not any(r["timeouts"].values())
    print(
        f"      target: {TARGET_ROLES} roles at 1 Hz cost < {TARGET_CPU_FRACTION:.0%} of a core "
        f"-> {r['cpu_hb']:.1%} at N={r['n']}, {hz:g} Hz: {'met' if cpu_ok else 'NOT met'}"
    )
    print(
        f"      target: registry p99 < {TARGET_P99_S * 1e3:.0f} ms -> "
        + ", ".join(f"{k.upper()} {v * 1e3:.1f} ms" for k, v in p99.items())
        + f" at N={r['n']}: {'met' if lat_ok else 'NOT met'}"
    )


# --- (b) weights broadcast -----------------------------------------------------------------


def sub_worker(spec: dict[str, Any], stop: threading.Event, report: Callable[..., None]) -> None:
    """``count`` subscribers, one thread and one SUB (made as a role makes it) each; every
    decoded WEIGHTS message is reported with its id and CLOCK_MONOTONIC arrival time."""
    eps, first, count = spec["endpoints"], spec["first"], spec["count"]
    size = BrokerConfig().max_topic_message_bytes
    ctx = zmq.Context()

    def subscriber(j: int) -> None:
        sock = make_socket(ctx, zmq.SUB, rcvhwm=1000, rcvtimeo_ms=100, max_message_bytes=size)
        sock.setsockopt(zmq.SUBSCRIBE, P.WEIGHTS_TOPIC.encode())
        connect_topics(sock, eps)
        ch = Channel(
            sock, "weights", f"sub-{j}", TransportStats(), topics=True, max_message_bytes=size
        )
        try:
            while not stop.is_set():
                got = ch.recv()
                if got is not None:
                    t = time.monotonic()
                    msg = got[1]
                    report("got", sub=j, id=msg.meta.get("id"), t=t, nbytes=msg.nbytes)
                    del msg, got
        finally:
            ch.close()

    threads = [
        threading.Thread(target=subscriber, args=(first + j,), daemon=True) for j in range(count)
    ]
    for th in threads:
        th.start()
    while not stop.wait(0.2):
        pass
    for th in threads:
        th.join(timeout=2)
    ctx.term()
    report("done")


def broadcast(
    workers: Workers, addr: str, broker: psutil.Process, n_subs: int, broadcasts: int
) -> dict[str, Any]:
    """One row of (b): ``n_subs`` subscribers, ``broadcasts`` 10 MiB sends after a warm-up."""
    eps = broker_endpoints(addr, list(DEFAULT_STREAMS))
    n_workers = min(SUB_WORKERS, n_subs)
    subs = [
        workers.start(
            "sub",
            {
                "endpoints": eps,
                "first": n_subs * w // n_workers,
                "count": n_subs * (w + 1) // n_workers - n_subs * w // n_workers,
            },
        )
        for w in range(n_workers)
    ]
    pids = {p.pid for p in subs}
    size = BrokerConfig().max_topic_message_bytes
    ctx: zmq.Context = zmq.Context.instance()
    # As the parameter server's publisher (Role.open_publisher).
    sock = make_socket(ctx, zmq.PUB, sndhwm=1000, max_message_bytes=size)
    sock.connect(eps["topics_in"])
    pub = Channel(
        sock, "weights", "params-0", TransportStats(), topics=True, max_message_bytes=size
    )
    weights = np.full(WEIGHTS_BYTES, 7, np.uint8)
    ping = np.zeros(PING_BYTES, np.uint8)

    def got(mid: int) -> Callable[[dict[str, Any]], bool]:
        return lambda r: r["event"] == "got" and r["id"] == mid and r["pid"] in pids

    try:
        # Late joiners get nothing from PUB/SUB: ping (bulk-lane sized) until every
        # subscriber has its subscription in place.
        seen: set[int] = set()
        deadline = time.monotonic() + BROADCAST_TIMEOUT_S
        while len(seen) < n_subs:
            if time.monotonic() > deadline or any(p.poll() is not None for p in subs):
                raise RuntimeError(
                    f"{len(seen)} of {n_subs} subscribers joined (logs in {workers.tmp})"
                )
            pub.send(
                P.Message(P.WEIGHTS, meta={"id": -1}, arrays={"ping": ping}), topic=P.WEIGHTS_TOPIC
            )
            time.sleep(0.1)
            seen |= {r["sub"] for r in workers.take(got(-1))}
        time.sleep(0.3)
        workers.take(got(-1))
        times: list[np.ndarray] = []
        lost = 0
        cpu0 = 0.0
        for i in range(BROADCAST_WARMUP + broadcasts):
            if i == BROADCAST_WARMUP:
                cpu0 = cpu_seconds(broker)
            t_send = time.monotonic()
            pub.send(
                P.Message(P.WEIGHTS, meta={"id": i, "version": i + 1}, arrays={"weights": weights}),
                topic=P.WEIGHTS_TOPIC,
            )
            try:
                arrivals = workers.wait_for(got(i), n_subs, BROADCAST_TIMEOUT_S, subs)
            except RuntimeError:
                arrivals = workers.take(got(i))
                lost += n_subs - len(arrivals)
            if any(r["nbytes"] != WEIGHTS_BYTES for r in arrivals):
                raise RuntimeError("a subscriber decoded weights of the wrong size")
            if i >= BROADCAST_WARMUP and arrivals:
                times.append(np.sort([r["t"] - t_send for r in arrivals]))
            time.sleep(0.1)
        cpu_per = (cpu_seconds(broker) - cpu0) / broadcasts
    finally:
        pub.close()
        workers.stop(subs)
    last = np.array([t[-1] for t in times])
    return {
        "subs": n_subs,
        "first": float(np.median([t[0] for t in times])),
        "median": float(np.median([np.median(t) for t in times])),
        "last": float(np.median(last)),
        "last_max": float(last.max()),
        "lost": lost,
        "broker_cpu": cpu_per,
        "rss": broker.memory_info().rss,
        "load": load_average(),
        "n": len(times),
    }


def print_broadcast(rows: list[dict[str, Any]], broadcasts: int) -> None:
    print(
        f"\n(b) weights broadcast: 10 MiB WEIGHTS (one uint8 array) PUB -> broker topic bus "
        f"(bulk lane, HWM {BrokerConfig().bulk_topic_hwm}) -> N SUB sockets over tcp loopback; "
        f"median of {broadcasts} broadcasts after {BROADCAST_WARMUP} warm-up"
    )
    print(
        f"{'subs':>5} | {'first ms':>8} | {'median ms':>9} | {'last ms':>8} | "
        f"{'last max ms':>11} | {'aggregate MB/s':>14} | {'broker CPU s/bcast':>18} | "
        f"{'lost':>4} | {'load avg':>14}"
    )
    for r in rows:
        agg = r["subs"] * WEIGHTS_BYTES / r["last"] / 1e6
        print(
            f"{r['subs']:>5} | {r['first'] * 1e3:>8.1f} | {r['median'] * 1e3:>9.1f} | "
            f"{r['last'] * 1e3:>8.1f} | {r['last_max'] * 1e3:>11.1f} | {agg:>14,.0f} | "
            f"{r['broker_cpu']:>18.3f} | {r['lost']:>4} | {r['load']:>14}"
        )
    print(
        "      first/median/last: when the first, the median and the last subscriber had "
        "decoded it (median over broadcasts); aggregate: subs x 10 MiB / last"
    )
    worst = max(rows, key=lambda r: r["subs"])
    ok = worst["last"] < BROADCAST_TARGET_S and not worst["lost"]
    print(
        f"      derived target: the last of {worst['subs']} subscribers has the weights within "
        f"{BROADCAST_TARGET_S:g} s (one version in flight at ~1 publish/s) -> "
        f"{worst['last'] * 1e3:.0f} ms: {'met' if ok else 'NOT met'}"
    )


# --- (c) experience fan-in -----------------------------------------------------------------


def trajectory(case: str) -> dict[str, np.ndarray]:
    """One trajectory message's arrays in the TRANSITIONS (CartPole) or FRAME_TRANSITIONS
    (Atari) layout of ``zrl.transport.messages``: T steps of E envs."""
    c = FANIN_CASES[case]
    e, t = c["E"], c["T"]
    step: dict[str, np.ndarray] = {
        "action": np.zeros((e, t), np.int64),
        "reward": np.ones((e, t), np.float32),
        "terminated": np.zeros((e, t), bool),
        "truncated": np.zeros((e, t), bool),
        "valid": np.ones((e, t), bool),
        "priority": np.ones((e, t), np.float32),
    }
    if "obs" in c:
        obs = np.full((e, t, *c["obs"]), 0.5, np.float32)
        return {"obs": obs, **step, "next_obs": obs.copy()}
    return {"frames": np.full((e, t + c["stack"] - 1, *c["frames"]), 9, np.uint8), **step}


def sender_worker(spec: dict[str, Any], stop: threading.Event, report: Callable[..., None]) -> None:
    """``count`` actors' PUSHes (made as Role.open_push makes them), one thread each, sending
    the same trajectory as fast as the stream's back-pressure lets them."""
    eps, first, count = spec["endpoints"], spec["first"], spec["count"]
    arrays = trajectory(spec["case"])
    kbuf = BrokerConfig().stream_buffer_bytes
    ctx = zmq.Context()
    sent = [0] * count
    timeouts = [0] * count

    def actor(j: int) -> None:
        sock = make_socket(ctx, zmq.PUSH, sndhwm=4, sndtimeo_ms=100, kernel_buffer_bytes=kbuf)
        sock.connect(eps["experience_in"])
        ch = Channel(sock, "experience", f"actor-{first + j}", TransportStats())
        try:
            while not stop.is_set():
                if ch.send(P.Message(P.TRAJECTORY, meta={"weights_version": 1}, arrays=arrays)):
                    sent[j] += 1
                else:
                    timeouts[j] += 1
        finally:
            ch.close()

    threads = [threading.Thread(target=actor, args=(j,), daemon=True) for j in range(count)]
    for th in threads:
        th.start()
    report("up")
    while not stop.wait(0.2):
        pass
    for th in threads:
        th.join(timeout=2)
    ctx.term()
    report("done", sent=sum(sent), timeouts=sum(timeouts))


def sink_worker(spec: dict[str, Any], stop: threading.Event, report: Callable[..., None]) -> None:
    """One PULL on ``experience_out`` (as Role.open_pull makes it), decoding and validating
    every message; reports its running counts every ``PROGRESS_S``."""
    ctx = zmq.Context()
    deadline = time.monotonic() + BROKER_START_TIMEOUT_S
    while not stop.is_set():
        try:
            registry_request(ctx, spec["broker"], P.Message(P.STATUS), timeout=0.5)
            break
        except Exception:
            if time.monotonic() > deadline:
                report("error", error="the broker did not answer STATUS within 30 s")
                return
    sock = make_socket(
        ctx,
        zmq.PULL,
        rcvhwm=4,
        rcvtimeo_ms=100,
        kernel_buffer_bytes=BrokerConfig().stream_buffer_bytes,
    )
    sock.connect(spec["endpoints"]["experience_out"])
    ch = Channel(sock, "experience", "replay-0", TransportStats())
    report("up")
    msgs = nbytes = 0
    next_report = time.monotonic()
    while not stop.is_set():
        got = ch.recv()
        if got is not None:
            msgs += 1
            nbytes += got[1].nbytes
        if (now := time.monotonic()) >= next_report:
            next_report = now + PROGRESS_S
            report(
                "progress",
                t=now,
                msgs=msgs,
                bytes=nbytes,
                dropped=ch.stats.dropped,
                gaps=ch.stats.gaps,
            )
    ch.close()
    ctx.term()


def fan_in_case(
    workers: Workers,
    hosts: Hosts,
    eps: dict[str, str],
    broker: psutil.Process,
    sink: psutil.Process,
    case: str,
    seconds: float,
) -> dict[str, Any]:
    """One row of (c): 8 actors in each actor namespace pushing ``case`` trajectories."""
    senders = [
        workers.start(
            "sender",
            {
                "endpoints": eps,
                "case": case,
                "count": ACTORS_PER_NAMESPACE,
                "first": h * ACTORS_PER_NAMESPACE,
            },
            hosts=hosts,
            host=h + 1,
        )
        for h in range(FANIN_NAMESPACES)
    ]
    pids = {p.pid for p in senders}
    try:
        workers.wait_for(
            lambda r: r["event"] == "up" and r["pid"] in pids, len(senders), 60, senders
        )
        time.sleep(WARMUP_S)
        workers.take(lambda r: r["event"] == "progress")
        c0, s0, t0 = cpu_seconds(broker), cpu_seconds(sink), time.monotonic()
        time.sleep(seconds)
        c1, s1, t1 = cpu_seconds(broker), cpu_seconds(sink), time.monotonic()
        progress = workers.take(lambda r: r["event"] == "progress")
    finally:
        done = workers.stop(senders, final="done")
    inside = [r for r in progress if t0 <= r["t"] <= t1]
    if len(inside) < 2:
        raise RuntimeError(f"the sink reported {len(inside)} times in the window")
    a, b = inside[0], inside[-1]
    dt = b["t"] - a["t"]
    c = FANIN_CASES[case]
    return {
        "case": case,
        "bytes": sum(x.nbytes for x in trajectory(case).values()),
        "msgs_s": (b["msgs"] - a["msgs"]) / dt,
        "mb_s": (b["bytes"] - a["bytes"]) / dt / 1e6,
        "broker_cpu": (c1 - c0) / (t1 - t0),
        "sink_cpu": (s1 - s0) / (t1 - t0),
        "dropped": b["dropped"],
        "gaps": b["gaps"],
        "sent": sum(d["sent"] for d in done),
        "timeouts": sum(d["timeouts"] for d in done),
        "demand": FANIN_NAMESPACES * ACTORS_PER_NAMESPACE * c["steps_per_s"] / (c["T"] * c["E"]),
        "load": load_average(),
    }


def fan_in(workers: Workers, cases: list[str], seconds: float) -> list[dict[str, Any]] | str:
    """(c): the rows, or why it was skipped."""
    ok, why = netns_available()
    if not ok:
        return why
    rows = []
    with Hosts(1 + FANIN_NAMESPACES, prefix="zrlsc") as hosts:
        hub = hosts.addrs[0]
        port = free_port_range(n_endpoints())  # the namespace is new: any port; this one
        addr = f"tcp://{hub}:{port}"  # also keeps the ipc directory apart from other brokers'
        eps = broker_endpoints(addr, list(DEFAULT_STREAMS))
        broker_proc = hosts.zrl(
            0,
            "start",
            "broker",
            "--bind",
            addr,
            "--config",
            str(CONFIG),
            "--no-preflight",
            "--insecure",
            log=workers.tmp / "fanin-broker.log",
        )
        workers.procs.append(broker_proc)
        sink = workers.start("sink", {"broker": addr, "endpoints": eps}, hosts=hosts, host=0)
        try:
            workers.wait_for(
                lambda r: r["event"] == "up" and r["pid"] == sink.pid,
                1,
                BROKER_START_TIMEOUT_S + 10,
                [sink, broker_proc],
            )
            for case in cases:
                rows.append(
                    fan_in_case(
                        workers,
                        hosts,
                        eps,
                        psutil.Process(broker_proc.pid),
                        psutil.Process(sink.pid),
                        case,
                        seconds,
                    )
                )
                time.sleep(1.0)  # the device drains what is queued
        finally:
            # The sink first, then the broker, with time to remove its ipc directory.
            kill_procs([sink], grace=3.0)
            kill_procs([broker_proc], grace=BROKER_STOP_GRACE_S)
    return rows


def print_fan_in(rows: list[dict[str, Any]] | str, seconds: float) -> None:
    actors = FANIN_NAMESPACES * ACTORS_PER_NAMESPACE
    print(
        f"\n(c) experience fan-in: {actors} actors ({ACTORS_PER_NAMESPACE} PUSH threads in each "
        f"of {FANIN_NAMESPACES} network namespaces) -> veth + bridge -> broker `experience` "
        f"device (hub namespace) -> 1 PULL sink decoding every message; {seconds:g} s per case"
    )
    if isinstance(rows, str):
        print(f"      SKIPPED: {rows}")
        return
    print(
        f"{'case':>9} | {'msg bytes':>10} | {'sink msg/s':>10} | {'sink MB/s':>9} | "
        f"{'transitions/s':>13} | {'broker CPU':>10} | {'sink CPU':>8} | {'demand msg/s':>12} | "
        f"{'verdict':>7} | {'load avg':>14}"
    )
    for r in rows:
        c = FANIN_CASES[r["case"]]
        ok = r["msgs_s"] >= r["demand"]
        print(
            f"{r['case']:>9} | {r['bytes']:>10,} | {r['msgs_s']:>10,.0f} | {r['mb_s']:>9,.1f} | "
            f"{r['msgs_s'] * c['T'] * c['E']:>13,.0f} | {r['broker_cpu']:>10.1%} | "
            f"{r['sink_cpu']:>8.1%} | "
            f"{r['demand']:>12,.0f} | {'met' if ok else 'NOT met':>7} | {r['load']:>14}"
        )
        if r["dropped"] or r["gaps"]:
            print(
                f"      {r['case']}: the sink dropped {r['dropped']}, saw {r['gaps']} sequence gaps"
            )
    print(
        "      demand (derived target): "
        + "; ".join(
            f"{r['case']} {actors} actors x {FANIN_CASES[r['case']]['steps_per_s']:,} env steps/s"
            f" / {FANIN_CASES[r['case']]['T'] * FANIN_CASES[r['case']]['E']} per message"
            for r in rows
        )
    )
    print(
        "      senders' send timeouts (100 ms each, back-pressure): "
        + ", ".join(f"{r['case']} {r['timeouts']}" for r in rows)
    )


# --- entry points ------------------------------------------------------------------------


WORKERS: dict[str, Callable[[dict[str, Any], threading.Event, Callable[..., None]], None]] = {
    "sim": sim_worker,
    "sub": sub_worker,
    "sender": sender_worker,
    "sink": sink_worker,
}


def worker_main(kind: str, spec: dict[str, Any]) -> None:
    """A worker process: runs ``WORKERS[kind]`` until SIGTERM, reporting to the parent."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.connect(spec["report"])
    lock = threading.Lock()

    def report(event: str, **fields: Any) -> None:
        with lock:
            out.send_json({"event": event, "pid": os.getpid(), **fields})

    try:
        WORKERS[kind](spec, stop, report)
    finally:
        out.close(linger=5000)
        ctx.term()


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="a,b,c", help="which of a,b,c to run")
    parser.add_argument(
        "--seconds",
        type=float,
        default=20.0,
        help="(a) window per N (half heartbeats only, half with probes); (c) half of it per case",
    )
    parser.add_argument(
        "--sizes", type=int_list, default=[10, 100, 1000], help="(a) numbers of simulated roles"
    )
    parser.add_argument("--hz", type=float, default=1.0, help="(a) heartbeats per role per second")
    parser.add_argument(
        "--per-agent",
        type=int_list,
        default=[0, 100],
        help="(a) roles per host agent, one table row per value and size (0: no agents, "
        "every role heartbeats itself)",
    )
    parser.add_argument(
        "--probe-hz",
        type=float,
        default=15.0,
        help="(a) probe requests per second (STATUS, LOOKUP, HELLO in turn)",
    )
    parser.add_argument(
        "--subs", type=int_list, default=[1, 8, 64, 256], help="(b) numbers of subscribers"
    )
    parser.add_argument("--broadcasts", type=int, default=5, help="(b) measured broadcasts per row")
    parser.add_argument(
        "--fanin", default="cartpole,atari", help=f"(c) cases: {','.join(FANIN_CASES)}"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker logs")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not args.sections <= {"a", "b", "c"}:
        parser.error(f"--sections takes a, b and c, not {args.sections}")
    args.fanin = [c.strip() for c in args.fanin.split(",") if c.strip()]
    if not set(args.fanin) <= set(FANIN_CASES):
        parser.error(f"--fanin takes {', '.join(FANIN_CASES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, json.loads(args.spec))
        return

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through every finally: nothing is left behind

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    print(
        f"zrl {__version__} | pyzmq {zmq.__version__} | libzmq {zmq.zmq_version()} | "
        f"python {sys.version.split()[0]} | {os.cpu_count()} cpus | load average "
        f"{load_average()}",
        flush=True,
    )
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="zrl-scale-"))
    workers = Workers(tmp)
    failed = True
    try:
        if "a" in args.sections:
            rows = []
            for per_agent in args.per_agent:
                for n in args.sizes:
                    if per_agent and n % per_agent:
                        print(f"  (a) N={n}: no whole number of agents of {per_agent}, skipped")
                        continue
                    rows.append(
                        registry_scale(workers, n, args.seconds, args.hz, args.probe_hz, per_agent)
                    )
                    print(f"  (a) N={n}, agents of {per_agent or '-'} done", flush=True)
            print_registry(rows, args)
        if "b" in args.sections:
            brows = []
            with local_broker(workers) as (addr, broker):
                for n in args.subs:
                    brows.append(broadcast(workers, addr, broker, n, args.broadcasts))
                    print(f"  (b) {n} subscribers done", flush=True)
            print_broadcast(brows, args.broadcasts)
        if "c" in args.sections:
            print_fan_in(fan_in(workers, args.fanin, args.seconds / 2), args.seconds / 2)
        failed = False
    finally:
        workers.close()
        if failed or args.keep_logs:
            print(f"worker and broker logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\n{time.monotonic() - started:.0f} s; load average now {load_average()} "
        f"({os.cpu_count()} CPUs, shared with other work); every process stopped by PID"
    )


if __name__ == "__main__":
    main()
