"""What the head of a run hears of it: the roles' metrics and evaluations on the topic bus,
and the broker's registry rows (STATUS); and the STOP_RUN that ends the run everywhere.

Only this run's registered evaluators report results: anyone who reaches the topic bus can
publish an eval, so one is taken only from a live ``evaluator-<i>`` the roster planned and,
when the head started it, run by the process it started (``registered``).

The same goes for the roles' figures. Their counters (env steps, updates, ...; what the
stop rule's ``stop.env_steps`` and progress.csv read) are taken from their heartbeats, in the
registry's rows (a heartbeat comes only from the connection that registered its id), for the
run's own roles only (``ours``). Their ``metrics`` on the topic bus give only the training
figures and the first env step, and count only under the id of a planned role of the
matching kind (``zrl.transport.senders``): whatever id or figures a message names, the head
keeps state for the roster's roles alone.

Sockets: a SUB on the topic bus (``metrics``, ``eval``); throwaway DEALERs for STATUS and
STOP_RUN.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from zrl.config.experiment import ExperimentConfig
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import read_status, registry_request
from zrl.run.aggregator import Aggregator, count, number
from zrl.run.metrics import MetricsWriter
from zrl.run.placement import BrokerAccess
from zrl.run.pool import ChildPool
from zrl.run.roster import Roster
from zrl.run.stop_rule import StopRule
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints, connect_topics
from zrl.transport.senders import may_send
from zrl.transport.sockets import Channel, TransportStats, make_socket

log = logging.getLogger("zrl.supervisor")

REMOTE_STOP_WAIT_S = 20.0
"""How long the head keeps the broker up for roles elsewhere to hear the stop and say BYE."""
STATUS_TIMEOUT_S = 3.0
"""How long one refresh of the registry's rows (every page of the listing) may take: at 1 s
a loaded machine's refreshes all failed and the head showed 0 steps while the roles trained."""
EVAL_SENDER_ASK_S = 1.0
DRAIN_BUDGET_S = 0.2
"""The longest one ``drain`` reads the topic bus before the head's loop goes on."""
STATUS_WARN_INTERVAL_S = 30.0
"""Failed STATUS refreshes are logged at most once per this, with how many failed."""


class TopicSource(Protocol):
    """What ``RunMonitor.drain`` reads: the SUB channel, or a test's feed of messages."""

    def recv(self, *, block: bool = True) -> tuple[bytes | None, P.Message] | None: ...

    def drop(self, sender: str, reason: str) -> None: ...


@dataclass(eq=False)
class RunMonitor:
    """The head's view of its run: the registry's rows, and the metrics and evals heard."""

    cfg: ExperimentConfig
    ctx: zmq.Context
    access: BrokerAccess
    pool: ChildPool
    roster: Roster
    agg: Aggregator
    target: StopRule
    status_rows: list[dict[str, Any]] = field(default_factory=list, init=False)
    """The registry's rows at the last STATUS that got an answer."""
    status_failures: int = field(default=0, init=False)
    """STATUS refreshes in a row that got no readable answer."""
    _next_status_warning: float = field(default=0.0, init=False)
    _asked_about: dict[str, float] = field(default_factory=dict, init=False)
    """When each planned evaluator id may be asked about again (``_eval_sender``)."""
    evals_dropped: int = field(default=0, init=False)
    """Evals published under a name that is no registered evaluator of this run."""
    first_env_step: float | None = field(default=None, init=False)
    """Seconds from the head's start to the first actor report of an env step."""
    metrics_dropped: int = field(default=0, init=False)
    """Metrics published under an id that is no planned role of this run (or of another kind)."""

    def __post_init__(self) -> None:
        # The aggregator keeps figures of the roster's roles only.
        self.agg.roles = frozenset(self.roster.planned)

    def open(self) -> Channel:
        """The SUB on the topic bus for ``metrics`` and ``eval``."""
        endpoints = broker_endpoints(self.access.broker_addr, self.cfg.broker.streams)
        sock = make_socket(
            self.ctx,
            zmq.SUB,
            rcvhwm=10_000,
            rcvtimeo_ms=0,
            keys=self.access.keys,
            max_message_bytes=self.cfg.broker.max_message_bytes,
        )
        for topic in (P.METRICS_TOPIC, P.EVAL_TOPIC):
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        connect_topics(sock, endpoints)
        return Channel(sock, "monitor", "supervisor", TransportStats(), topics=True)

    def drain(self, source: TopicSource, writer: MetricsWriter, elapsed: float) -> None:
        """What ``source`` holds now, for at most ``DRAIN_BUDGET_S``: metrics to the
        aggregator, evals (of this run's evaluators) to ``writer`` and the stop rule. Bounded:
        a flood of messages (forged metrics faster than the head reads them) must not hold the
        head's loop, which refreshes the roles' rows and checks the stop rules between."""
        until = time.monotonic() + DRAIN_BUDGET_S
        while time.monotonic() < until:
            got = source.recv(block=False)
            if got is None:
                return
            meta, sender = got[1].meta, got[1].sender
            if meta.get("kind") == "eval":
                if self._eval_sender(sender) is None:
                    self.evals_dropped += 1
                    source.drop(sender or "?", "eval from no registered evaluator of this run")
                    continue
                if number(meta.get("mean")) is None:
                    source.drop(sender or "?", "eval result without a numeric mean")
                    continue
                row = self.agg.on_eval(meta, elapsed)
                writer.write_eval(row)
                self.target.on_eval(row, sender)
            else:
                rid = meta.get("id")
                role = self.planned_role(rid)
                if role is None or meta.get("role") != role:
                    self.metrics_dropped += 1
                    source.drop("unplanned", "metrics under no planned role id of this run")
                    continue
                assert isinstance(rid, str)
                # The counters come from the heartbeats (count_rows): only the training figures.
                self.agg.on_train(rid, role, meta.get("train"))
                if (
                    self.first_env_step is None
                    and role == "actor"
                    and count(meta.get("env_steps")) > 0
                ):
                    # Actors report once a second: this is when we heard of the first step.
                    self.first_env_step = round(elapsed, 2)

    def planned_role(self, rid: Any) -> str | None:
        """The role of ``rid`` if it is one of the roster's planned ids and that role may
        publish metrics (``zrl.transport.senders``); else None."""
        if not isinstance(rid, str) or rid not in self.roster.planned:
            return None
        role = rid.rsplit("-", 1)[0]
        return role if may_send(P.METRICS, role, f"topic:{P.METRICS_TOPIC}") else None

    def ours(self, row: Any) -> str | None:
        """The role of the registry's ``row`` if it is one of this run's planned roles (of
        the role its id names) and, when we started it here, run by the process we started
        (any state: an ended role's last heartbeat counts); else None."""
        rid = row.get("id") if isinstance(row, dict) else None
        if not isinstance(rid, str) or rid not in self.roster.planned:
            return None
        role = rid.rsplit("-", 1)[0]
        if row.get("role") != role:
            return None
        child = next((c for c in self.pool.children if c.name == rid), None)
        if child is not None and child.proc is not None and row.get("pid") != child.proc.pid:
            return None
        return role

    def count_rows(self) -> None:
        """The roles' counters from their heartbeats (the ``info`` of the registry's rows),
        for this run's own roles only (``ours``)."""
        for r in self.status_rows:
            role = self.ours(r)
            info = r.get("info") if role is not None else None
            if isinstance(info, dict):
                self.agg.on_metrics({**info, "id": r["id"], "role": role})

    def league_info(self) -> dict[str, Any] | None:
        """The heartbeat info of this run's league role (``ours``) in the last rows, or None
        (no league, or none heard yet)."""
        for r in self.status_rows:
            if self.ours(r) == "league" and isinstance(r.get("info"), dict):
                info: dict[str, Any] = r["info"]
                return info
        return None

    def _eval_sender(self, rid: Any) -> dict[str, Any] | None:
        """The registry's row of a live evaluator of this run that sent an eval: from the
        last listing, else (an evaluator registered since, or a listing that came late under
        load) from a STATUS about that id alone, at most once per ``EVAL_SENDER_ASK_S`` per
        id. A result of a real evaluator is never dropped for a stale listing."""
        row = self.registered(rid, "evaluator")
        if row is not None or not isinstance(rid, str) or rid not in self.roster.planned:
            return row
        now = time.monotonic()
        if now < self._asked_about.get(rid, 0.0):
            return None
        self._asked_about[rid] = now + EVAL_SENDER_ASK_S
        return self.registered(rid, "evaluator", ask=True)

    def registered(self, rid: Any, role: str, *, ask: bool = False) -> dict[str, Any] | None:
        """The broker's row for ``rid`` if it is one of this run's ``role`` roles, live, and
        (when we started it here) run by the process we started; else None. ``ask``: the
        row comes from a STATUS about ``rid`` alone (its whole info), not the last listing."""
        if not isinstance(rid, str) or not rid.startswith(f"{role}-"):
            return None
        if rid not in self.roster.planned:
            return None
        if ask:
            row = self.role_row(rid)
        else:
            row = next((r for r in self.status_rows if r.get("id") == rid), None)
        if row is None or row.get("role") != role or row.get("state") not in ("starting", "alive"):
            return None
        child = next((c for c in self.pool.children if c.name == rid), None)
        if child is not None and child.proc is not None and row.get("pid") != child.proc.pid:
            return None
        return row

    def refresh(self) -> bool:
        """Fetch the registry's rows (every page of the listing); False when the broker did
        not answer in time (the rows are the previous ones)."""
        try:
            reply = read_status(
                self.ctx, self.access.broker_addr, STATUS_TIMEOUT_S, self.access.keys
            )
        except RoleError as exc:
            self._status_failed(exc)
            return False
        if self.status_failures:
            log.info("the broker answers STATUS again (%d refreshes failed)", self.status_failures)
            self.status_failures = 0
        self.status_rows = reply["roles"]
        self.count_rows()
        return True

    def _status_failed(self, exc: RoleError) -> None:
        """Count a failed refresh; warn at the first and then at most once per
        STATUS_WARN_INTERVAL_S (the head refreshes several times a second)."""
        self.status_failures += 1
        now = time.monotonic()
        if now >= self._next_status_warning:
            self._next_status_warning = now + STATUS_WARN_INTERVAL_S
            log.warning(
                "no STATUS from the broker (%d refreshes failed so far): %s",
                self.status_failures,
                exc,
            )

    def role_row(self, rid: str) -> dict[str, Any] | None:
        """The broker's whole row for ``rid`` alone (a STATUS for that id: whatever the
        registry holds, the answer is one row), or None when it has none or did not answer."""
        try:
            reply = read_status(
                self.ctx,
                self.access.broker_addr,
                STATUS_TIMEOUT_S,
                self.access.keys,
                role_id=rid,
            )
        except RoleError as exc:
            self._status_failed(exc)
            return None
        rows = [r for r in reply["roles"] if isinstance(r, dict) and r.get("id") == rid]
        return rows[0] if rows else None

    def final_row(self, row: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """The figures at the stop, from the roles' last heartbeats: metrics come once a
        second, so a run stopped between two of them would under-report what its roles did."""
        self.refresh()  # (count_rows: the last heartbeats' counters)
        return self.agg.row(elapsed) if self.status_rows else row

    def stop_run(self, reason: str, elapsed: float, wait_s: float = REMOTE_STOP_WAIT_S) -> None:
        """Tell every role, wherever it runs, that the experiment is over (STOP_RUN), and keep
        the broker up until the roles elsewhere have said BYE or ``wait_s`` passed (default
        REMOTE_STOP_WAIT_S; less for a run stopped by Ctrl-C)."""
        try:
            reply = registry_request(
                self.ctx,
                self.access.broker_addr,
                P.Message(P.STOP_RUN, meta={"token": self.pool.stop_token, "reason": reason}),
                2.0,
                self.access.keys,
            )
        except RoleError as exc:
            log.warning("could not tell the broker to stop the experiment: %s", exc)
            return
        if reply.kind != P.STOP_RUN:
            log.warning("the broker refused to stop the experiment: %s", reply.meta.get("reason"))
            return
        deadline = time.monotonic() + wait_s
        while True:
            self.refresh()
            self.roster.update(self.status_rows, elapsed)
            running = self.roster.still_running_elsewhere()
            if not running:
                return
            if time.monotonic() >= deadline:
                log.warning("still running elsewhere after the stop: %s", ", ".join(running))
                return
            time.sleep(0.2)
