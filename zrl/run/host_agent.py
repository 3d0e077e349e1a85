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
stops when the broker says the experiment stopped. Its heartbeat info lists its children (id,
pid, state, restarts, log path, last log lines) for ``zrl status --logs ROLE_ID``. It stops its
children in data-flow order (``stop_in_order``) at the broker's stop, on SIGTERM/SIGINT, and
when the broker has not answered for ``orphan_timeout`` seconds (then it exits non-zero: roles
must not outlive their experiment). Starting, restarting and stopping are ``zrl.run.children``'s
pieces, the same ones ``zrl run``'s ``ChildPool`` uses.

A role started without a first index (``actor=4``) is numbered by the broker; the agent learns
the id from the child itself, which writes its id and state (``running`` once set up) to a
file in a private directory of the agent (``zrl.roles.base.PARENT_REPORT_ENV``), and passes
``--index`` to every later life, so a restarted role keeps its id. Never from the registry's
STATUS rows: anyone registered can list a row with this host's name and a child's pid.

Sockets: the ``Role`` registry DEALER (HELLO/WELCOME, HEARTBEAT, BYE).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zrl.broker.limits import info_fits
from zrl.roles import ROLE_MODULES
from zrl.roles.base import MAX_ROLE_INDEX, PARENT_REPORT_ENV, Role, read_parent_report
from zrl.roles.errors import RoleError
from zrl.run.children import Child, RestartPolicy, launch, show_tail, stop_in_order
from zrl.run.rundir import log_tail
from zrl.run.zygote import Zygote
from zrl.transport.endpoints import split_tcp

DEFAULT_ORPHAN_TIMEOUT_S = 300.0
TAIL_LINES = 3
TAIL_LINE_CHARS = 160
ROLE_ALIASES = {"actors": "actor", "learners": "learner"}  # the config's role count keys
SPEC = re.compile(r"(?P<role>[a-z]+)(?:=(?P<count>\d+)(?:@(?P<first>\d+))?)?")


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

    role = "host"

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

    def setup(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.open_reports()
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

    def step(self) -> None:
        self.stop_event.wait(0.1)
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
        return fit_info(
            {"log_dir": str(self.log_dir)}, self.children, self.config.broker.max_info_bytes
        )

    def publish_metrics(self, info: dict[str, Any]) -> None:
        """Nothing: the agent's figures are its children's, in its heartbeat (STATUS)."""

    def teardown(self) -> None:
        running = [c.name for c in self.children if c.alive()]
        if running:
            self.log.info("stopping %s", ", ".join(running))
        stop_in_order(self.children)
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
    found = [
        (row, child)
        for row in rows
        if row.get("role") == HostAgent.role and isinstance(row.get("info"), dict)
        for child in row["info"].get("children") or []
        if isinstance(child, dict) and child.get("id") == role_id
    ]
    if not found:
        return None
    return min(found, key=lambda f: (f[0].get("state") != "alive", f[0].get("age", 0.0)))
