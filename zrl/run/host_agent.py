"""``zrl host``: the roles of one host, started, restarted and stopped by one agent.

``zrl host --broker ADDR actor=4 replay=1`` starts each role as ``zrl start ROLE --broker
ADDR ...`` (forked from the zygote like ``zrl run``'s roles, see ``zrl.run.zygote``), each logging
to its own file under the log directory. A child that exits non-zero, or is killed by a
signal, restarts with ``zrl run``'s back-off; past the budget it is given up (logged with its
last lines, and reported). A child that exits 0 ended cleanly (SIGTERM, or the broker said the
experiment stopped) and is never restarted; when every child has ended so, the agent exits 0.
A given-up child keeps the agent running, to report it, until the experiment stops; the agent
then exits 1.

The agent is a ``Role`` itself (role ``host``): it registers with the broker, heartbeats, and
stops when the broker says the experiment stopped. It heartbeats for its children too: each
child names the agent in its HELLO (``zrl.roles.base.AGENT_ID_ENV``) and, once the registry
registered it under the agent, heartbeats the agent's ipc ROUTER instead of the broker; the
agent's own HEARTBEAT carries a report per child heard within ``FRESH_INTERVALS`` of its
interval (``roles``: its counters and info), so the broker reads one message per host per
interval. The agent answers a child's heartbeat while the broker answers its own (and relays
the broker's ``stop``, and UNKNOWN_ROLE for the children the broker did not take). Its
heartbeat info lists its children (id, pid, state, restarts, log path, last log lines) for
``zrl status --logs ROLE_ID``. It stops its
children in data-flow order (``stop_in_order``) at the broker's stop, on SIGTERM/SIGINT, and
when the broker has not answered for ``orphan_timeout`` seconds (then it exits non-zero: roles
must not outlive their experiment). Starting, restarting and stopping are ``zrl.run.children``'s
pieces, the same ones ``zrl run``'s ``ChildPool`` uses.

A role started without a first index (``actor=4``) is numbered by the broker; the agent learns
the id from the child itself, which writes its id and state (``running`` once set up) to a
file in a private directory of the agent (``zrl.roles.base.PARENT_REPORT_ENV``), and passes
``--index`` to every later life, so a restarted role keeps its id. Never from the registry's
STATUS rows: anyone registered can list a row with this host's name and a child's pid.

Weights go out from the broker once per host: the agent's ``WeightsRelay`` (a thread,
``zrl.run.weights_relay``) subscribes to the weights topics its children subscribe to and
republishes the raw frames on an ipc XPUB in the private directory, which every child's
weights follower connects to (``zrl.roles.role_sockets.WEIGHTS_RELAY_ENV``) instead of the
broker's bus. A relay thread that dies stops the agent, and with it its children.

Sockets: the ``Role`` registry DEALER (HELLO/WELCOME, HEARTBEAT with ``roles``, BYE); ROUTER
``children`` bound at ``ipc://<private dir>/heartbeats`` (the children's HEARTBEAT, answered
HEARTBEAT_ACK or UNKNOWN_ROLE); the relay's SUB -> the broker's topic bus (weights topics) and
XPUB bound at ``ipc://<private dir>/weights`` (the children's weights SUBs).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq

from zrl.broker.limits import AGENT_REPORT_BYTES, MAX_REPORTED_ROLES, info_fits
from zrl.roles import ROLE_MODULES
from zrl.roles.base import (
    AGENT_ENDPOINT_ENV,
    AGENT_ID_ENV,
    MAX_ROLE_INDEX,
    PARENT_REPORT_ENV,
    Role,
    read_parent_report,
)
from zrl.roles.errors import RoleError
from zrl.roles.role_sockets import WEIGHTS_RELAY_ENV
from zrl.run.children import Child, RestartPolicy, launch, show_tail, stop_in_order
from zrl.run.roster import HOST_AGENT_ROLE, agent_child_reports
from zrl.run.rundir import log_tail
from zrl.run.weights_relay import WeightsRelay
from zrl.run.zygote import Zygote
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.endpoints import split_tcp
from zrl.transport.sockets import Channel, make_socket

DEFAULT_ORPHAN_TIMEOUT_S = 300.0
TAIL_LINES = 3
TAIL_LINE_CHARS = 160
ROLE_ALIASES = {"actors": "actor", "learners": "learner"}  # the config's role count keys
SPEC = re.compile(r"(?P<role>[a-z]+)(?:=(?P<count>\d+)(?:@(?P<first>\d+))?)?")
FRESH_INTERVALS = 2
"""A child is reported alive while its last heartbeat is at most this many of its
heartbeat intervals old: one that stops heartbeating is dropped from the next reports."""
FIGURES_INTERVAL_S = 1.0
"""A child's counters and info go to the broker at most this often (its liveness with every
report): at the shipped 2 Hz heartbeat, half the broker's work per role."""
LIVENESS_KEYS = ("state", "loop")
"""What a child's report carries besides its id even without its figures: whether it is
still setting up, and its loop's turns (the broker tells a stalled role from a dead one)."""
CHILD_BEAT_SLACK_BYTES = 16 * 2**10  # a child's heartbeat: its info, plus ids and counters
STEP_POLL_MS = 100


@dataclass(frozen=True)
class RoleSpec:
    """``ROLE=N@FIRST`` on the command line: ``count`` roles, indices ``first`` on (None: the
    broker numbers them)."""

    role: str
    count: int
    first: int | None = None


def parse_role_specs(tokens: list[str]) -> list[RoleSpec]:
    """``ROLE``, ``ROLE=N`` or ``ROLE=N@FIRST`` tokens; ValueError naming the bad one."""
    if not tokens:
        raise ValueError("give the roles of this host, e.g. actor=4 replay=1")
    specs: list[RoleSpec] = []
    taken: set[str] = set()
    for token in tokens:
        m = SPEC.fullmatch(token.strip())
        if m is None:
            raise ValueError(f"bad role spec {token!r}: write ROLE, ROLE=N or ROLE=N@FIRST")
        role = ROLE_ALIASES.get(m["role"], m["role"])
        if role not in ROLE_MODULES:
            raise ValueError(
                f"bad role spec {token!r}: unknown role {m['role']!r}; roles are "
                f"{', '.join(ROLE_MODULES)}"
            )
        count = int(m["count"]) if m["count"] is not None else 1
        if count < 1:
            raise ValueError(f"bad role spec {token!r}: N must be at least 1")
        first = int(m["first"]) if m["first"] is not None else None
        if count - 1 + (first or 0) > MAX_ROLE_INDEX:
            raise ValueError(f"bad role spec {token!r}: role indices go from 0 to {MAX_ROLE_INDEX}")
        if first is not None:
            ids = {f"{role}-{i}" for i in range(first, first + count)}
            if ids & taken:
                raise ValueError(f"bad role spec {token!r}: {min(ids & taken)} is given twice")
            taken |= ids
        specs.append(RoleSpec(role, count, first))
    return specs


def default_log_dir(broker: str) -> Path:
    """``./zrl-logs/<broker host>-<port>/``: one directory per experiment on this host."""
    try:
        host, port = split_tcp(broker)
        name = f"{host.strip('[]')}-{port}"
    except ValueError:  # ipc:// or inproc://
        name = broker.split("://", 1)[-1]
    return Path("zrl-logs") / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "broker")


@dataclass(eq=False)
class HostChild(Child):
    """One role of this host, through all its lives."""

    slot: int = 0
    """Its place among this host's unnumbered roles of its kind: its name until the broker
    numbers it (``actor.0``)."""
    given_up: bool = False
    ended: bool = False
    """Exited 0: ended cleanly, never restarted."""
    report_path: Path | None = None
    """Where each life writes its id and state (``zrl.roles.base.write_parent_report``)."""
    running: bool = False
    """This life reported that it is set up and running."""

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}" if self.index is not None else f"{self.role}.{self.slot}"

    @property
    def state(self) -> str:
        if self.given_up:
            return "given up"
        if self.ended:
            return "ended"
        return "restarting" if self.restart_at is not None else "running"

    def report(self, tail: bool) -> dict[str, Any]:
        """What the agent's heartbeat says about this child (``tail``: its last log lines)."""
        out: dict[str, Any] = {
            "id": self.name,
            "pid": self.proc.pid if self.proc is not None else None,
            "state": self.state,
            "restarts": self.restarts,
            "log": str(self.log_path),
        }
        if self.state != "running":
            out["exit_code"] = self.last_exit_code
        if tail:
            out["tail"] = [
                line[:TAIL_LINE_CHARS]
                for line in log_tail(self.log_path, TAIL_LINES, window=4 * 1024)
            ]
        return out


def plan_children(specs: list[RoleSpec], log_dir: Path) -> list[HostChild]:
    """The children of ``specs``, each with its log file under ``log_dir``."""
    children: list[HostChild] = []
    slots: dict[str, int] = {}
    for spec in specs:
        for k in range(spec.count):
            if spec.first is not None:
                child = HostChild(spec.role, spec.first + k, Path())
            else:
                child = HostChild(spec.role, None, Path(), slot=slots.get(spec.role, 0))
                slots[spec.role] = child.slot + 1
            child.log_path = log_dir / f"{child.name}.log"
            children.append(child)
    return children


def fit_info(info: dict[str, Any], children: list[HostChild], max_bytes: int) -> dict[str, Any]:
    """``info`` with ``children``'s reports under ``children``, within the broker's heartbeat
    info limit (``max_bytes``, and the registry's item count): log tails go first, from the
    last child back, then the last children (counted in ``children_omitted``)."""
    reports = [c.report(tail=True) for c in children]

    def fits() -> bool:
        omitted = len(children) - len(reports)
        candidate = {**info, "children": reports, "children_omitted": omitted, "rss_mb": 0.0}
        return info_fits(candidate, max_bytes - 16)  # the Role base adds rss_mb after us

    for i in reversed(range(len(reports))):
        if fits():
            break
        reports[i].pop("tail", None)
    while reports and not fits():
        reports.pop()
    out = {**info, "children": reports}
    if len(reports) < len(children):
        out["children_omitted"] = len(children) - len(reports)
    return out


class HostAgent(Role):
    """The agent of ``zrl host``: this host's roles as children, and a role of its own."""

    role = HOST_AGENT_ROLE

    def __init__(
        self,
        broker: str,
        specs: list[RoleSpec],
        *,
        log_dir: Path,
        role_args: list[str],
        orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT_S,
        restart: RestartPolicy | None = None,
        **role_options: Any,
    ) -> None:
        """``role_args``: what every ``zrl start ROLE`` gets after ``--broker`` and
        ``--index`` (keys, factories, connect timeout, log level); ``role_options``: Role's."""
        super().__init__(broker, **role_options)
        self.log_dir = log_dir
        self.role_args = list(role_args)
        self.orphan_timeout = orphan_timeout
        self.policy = restart or RestartPolicy.default()
        self.children = plan_children(specs, log_dir)
        self.zygote = Zygote()
        self.reports_dir: Path | None = None
        """Where the children write their ids and states: a private directory of ours."""
        self.endpoint = ""
        """Where the children heartbeat us: an ipc ROUTER in ``reports_dir``."""
        self._beats_in: Channel | None = None
        self.relay: WeightsRelay | None = None
        """The children's weights, one copy from the broker (``zrl.run.weights_relay``)."""
        self.beats: dict[str, tuple[float, dict[str, Any]]] = {}
        """Each child's last heartbeat (when, and its report for the broker), by role id."""
        self.figures_sent: dict[str, float] = {}
        """When each child's counters and info last went to the broker."""
        self.unknown: set[str] = set()
        """Children the broker does not know under this agent: told to say HELLO again."""
        self.stop_reason: str | None = None

    @property
    def given_up(self) -> list[HostChild]:
        return [c for c in self.children if c.given_up]

    # --- children -----------------------------------------------------------------------

    def spawn(self, child: Child) -> None:
        assert isinstance(child, HostChild)
        child.started = time.monotonic()
        index = [] if child.index is None else ["--index", str(child.index)]
        argv = ["start", child.role, "--broker", self.broker, *index, *self.role_args]
        env: dict[str, str] = {}
        if self.endpoint:
            env[AGENT_ID_ENV] = self.id
            env[AGENT_ENDPOINT_ENV] = self.endpoint
        if self.relay is not None:
            env[WEIGHTS_RELAY_ENV] = self.relay.endpoint
        if child.report_path is not None:
            child.report_path.unlink(missing_ok=True)  # the last life's
            env[PARENT_REPORT_ENV] = str(child.report_path)
        child.running = False
        child.proc = launch(argv, child.log_path, self.zygote, env)

    def _came_up(self, child: Child) -> bool:
        return isinstance(child, HostChild) and child.running

    def _tend(self, now: float) -> None:
        """Restart what crashed (back-off, budget), mark what ended cleanly."""
        for child in self.children:
            if child.given_up or child.ended:
                continue
            code = self.policy.tend(child, now, self.spawn, self._came_up)
            if code is None:
                continue
            if code == 0:
                child.ended = True
                self.log.info("%s ended (exit code 0)", child.name)
            elif self.policy.crashed(child, now, self.log.warning):
                child.given_up = True
                show_tail(
                    child,
                    f"{child.name} crashed {child.restarts + 1} times (last exit "
                    f"code {code}): given up",
                    self.log.error,
                )

    # --- what the children say: the ids the broker gave them, whether they are up ---------

    def read_reports(self) -> None:
        """Each running child's own report (its id and state, for the pid we started): the
        id the broker gave it (passed as ``--index`` from its next life on), and whether it
        is set up and running."""
        for child in self.children:
            if child.report_path is None or child.proc is None or child.running:
                continue
            if not child.alive():
                continue
            got = read_parent_report(child.report_path, child.role, child.proc.pid)
            if got is None:
                continue
            number, state = got
            if child.index is None:
                planned = child.name
                child.index = number
                self.log.info("%s is %s (log: %s)", planned, child.name, child.log_path)
            child.running = state == "running"

    # --- Role -----------------------------------------------------------------------------

    # --- the children's heartbeats, reported to the broker in ours -----------------------

    def open_heartbeats(self) -> None:
        """The ROUTER the children heartbeat (``AGENT_ENDPOINT_ENV``), in ``reports_dir``."""
        assert self.reports_dir is not None
        limit = self.config.broker.max_info_bytes + CHILD_BEAT_SLACK_BYTES
        sock = make_socket(
            self.ctx,
            zmq.ROUTER,
            sndtimeo_ms=0,
            rcvhwm=4 * len(self.children) + 64,
            max_message_bytes=limit,
        )
        self.endpoint = f"ipc://{self.reports_dir / 'heartbeats'}"
        sock.bind(self.endpoint)
        self._beats_in = Channel(
            sock, "children", self.id, self.stats, envelope=True, max_message_bytes=limit
        )
        self._channels.append(self._beats_in)

    def child_named(self, rid: str) -> HostChild | None:
        """The child whose role id (as the broker numbered it) is ``rid``."""
        for child in self.children:
            if child.index is not None and child.name == rid:
                return child
        return None

    def serve_children(self, wait_ms: int) -> None:
        """Take the heartbeats waiting on our ROUTER (after up to ``wait_ms`` for the first):
        kept for our next report, and answered HEARTBEAT_ACK while the broker answers us
        (UNKNOWN_ROLE when it does not know the child under us). Anything else is dropped and
        counted (``children`` stream)."""
        ch = self._beats_in
        if ch is None or not ch.sock.poll(wait_ms):
            return
        now = time.monotonic()
        for _ in range(4 * len(self.children) + 16):
            got = ch.recv(block=False)
            if got is None:
                return
            ident, msg = got
            assert ident is not None
            rid = msg.meta.get("id")
            if msg.kind != P.HEARTBEAT or not isinstance(rid, str):
                ch.drop(msg.sender or "?", f"a {msg.kind} where only heartbeats are taken")
                continue
            if self.child_named(rid) is None:
                self.read_reports()  # a child that said who it is since our last look
                if self.child_named(rid) is None:
                    ch.drop(rid, "a heartbeat for a role this agent did not start")
                    continue
            # A beat of the child's heartbeat thread (no stats, no info) keeps its last figures.
            last = self.beats.get(rid, (now, {}))[1]
            report = {k: msg.meta.get(k, last.get(k)) for k in ("id", "stats", "info")}
            state, loop = msg.meta.get("state"), msg.meta.get("loop")
            if isinstance(state, str) and len(state) <= 16:
                report["state"] = state
            if type(loop) is int and 0 <= loop <= M.MAX_HEARTBEAT_SEQ:
                report["loop"] = loop
            self.beats[rid] = (now, report)
            if rid in self.unknown:
                self.unknown.discard(rid)
                ch.reply(P.Message(P.UNKNOWN_ROLE, meta={"id": rid}), to=ident)
            elif now - self._last_ack <= self.heartbeat_timeout:
                ack: dict[str, Any] = {}
                if self.stop_reason is not None:
                    ack["stop"] = self.stop_reason
                if (seq := M.heartbeat_seq(msg.meta)) is not None:
                    ack["seq"] = seq
                ch.reply(P.Message(P.HEARTBEAT_ACK, meta=ack), to=ident)

    def role_reports(self, now: float) -> list[dict[str, Any]]:
        """Our report to the broker: each child that heartbeated us within
        ``FRESH_INTERVALS`` of its interval, with its counters and info once per
        ``FIGURES_INTERVAL_S`` while they fit ``AGENT_REPORT_BYTES`` (and the broker's message
        limit); its id alone otherwise (alive, figures as they were)."""
        fresh = FRESH_INTERVALS * self.heartbeat_interval
        budget = min(
            AGENT_REPORT_BYTES,
            self.max_message_bytes - self.config.broker.max_info_bytes - CHILD_BEAT_SLACK_BYTES,
        )
        reports: list[dict[str, Any]] = []
        used = 0
        for rid, (when, report) in list(self.beats.items()):
            if now - when > fresh:
                del self.beats[rid]
                self.figures_sent.pop(rid, None)
                continue
            if len(reports) >= MAX_REPORTED_ROLES:
                break
            # Its state and loop turns with every report (starting or alive; stalled or not).
            alone = {"id": rid, **{k: report[k] for k in LIVENESS_KEYS if k in report}}
            if now - self.figures_sent.get(rid, -FIGURES_INTERVAL_S) < FIGURES_INTERVAL_S:
                report = alone
            try:
                size = len(msgpack.packb(report, use_bin_type=True))
            except (TypeError, ValueError, OverflowError):
                size = budget + 1
            if used + size > budget:
                report, size = alone, 48 + len(rid)
            if report is not alone:  # its figures went
                self.figures_sent[rid] = now
            reports.append(report)
            used += size
        return reports

    def heartbeat_extra(self) -> dict[str, Any]:
        return {"roles": self.role_reports(time.monotonic())} if self.endpoint else {}

    def on_heartbeat_ack(self, meta: dict[str, Any]) -> None:
        """The broker's answer to our report: ``unknown``, the children to say HELLO again
        (only ours are kept); ``stop``, relayed to the children."""
        unknown = meta.get("unknown")
        if isinstance(unknown, list):
            for rid in unknown[: len(self.children)]:
                if isinstance(rid, str) and self.child_named(rid) is not None:
                    self.unknown.add(rid)
        stop = meta.get("stop")
        if isinstance(stop, str):
            self.stop_reason = stop

    def setup(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.open_reports()
        self.open_heartbeats()
        self.open_weights_relay()
        self.zygote.start(self.log_dir / "zygote.log")
        for child in self.children:
            self.spawn(child)
        self.log.info(
            "started %s; logs in %s", ", ".join(c.name for c in self.children), self.log_dir
        )

    def open_reports(self) -> None:
        """The private directory (mode 0700) the children write their reports to."""
        self.reports_dir = Path(tempfile.mkdtemp(prefix="zrl-host-"))
        for k, child in enumerate(self.children):
            child.report_path = self.reports_dir / f"{k}.json"

    def open_weights_relay(self) -> None:
        """The relay of the broker's weights topics to the children, in ``reports_dir``."""
        assert self.reports_dir is not None
        self.relay = WeightsRelay(
            self.ctx,
            self.endpoints,
            self.reports_dir,
            max_message_bytes=self.max_topic_message_bytes,
            keys=self.keys,
        )
        self.relay.start()

    def step(self) -> None:
        if self.relay is not None and not self.relay.alive():
            raise RoleError("the weights relay of this host stopped: stopped its roles")
        if self._beats_in is not None:
            self.serve_children(STEP_POLL_MS)
        else:
            self.stop_event.wait(STEP_POLL_MS / 1000)
        self.read_reports()
        now = time.monotonic()
        self._tend(now)
        if now - self._last_ack > self.orphan_timeout:
            raise RoleError(
                f"no answer from the broker at {self.broker} for {self.orphan_timeout:g}s "
                "(--orphan-timeout): stopped the roles of this host"
            )
        if all(c.ended for c in self.children):
            self.log.info("every role of this host ended: stopping")
            self.request_stop()

    def orphan_limit(self) -> float | None:
        """None: the agent applies its own ``--orphan-timeout`` (``step``), and fails."""
        return None

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"log_dir": str(self.log_dir)}
        if self.relay is not None:
            r = self.relay
            info["weights_relay"] = {
                "received": r.received,
                "relayed": r.relayed,
                "superseded": r.superseded,
                "dropped": r.dropped,
                "topics": len(r.topics),
            }
        return fit_info(info, self.children, self.config.broker.max_info_bytes)

    def publish_metrics(self, info: dict[str, Any]) -> None:
        """Nothing: the agent's figures are its children's, in its heartbeat (STATUS)."""

    def teardown(self) -> None:
        running = [c.name for c in self.children if c.alive()]
        if running:
            self.log.info("stopping %s", ", ".join(running))
        stop_in_order(self.children)
        if self.relay is not None:
            self.relay.close()
        self.zygote.stop()
        for child in self.given_up:
            self.log.error("%s was given up; see %s", child.name, child.log_path)
        if self.reports_dir is not None:
            shutil.rmtree(self.reports_dir, ignore_errors=True)


def find_child_report(
    rows: list[dict[str, Any]], role_id: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the host agent's STATUS row, its report of ``role_id``), or None when no agent lists
    it; a live agent's report before a stopped one's, then the freshest."""
    found = [(row, child) for row, child in agent_child_reports(rows) if child.get("id") == role_id]
    if not found:
        return None
    return min(found, key=lambda f: (f[0].get("state") != "alive", f[0].get("age", 0.0)))
