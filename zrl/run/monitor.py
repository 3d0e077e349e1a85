"""What the head of a run hears of it: the roles' metrics and evaluations on the topic bus,
and the broker's registry rows (STATUS); and the STOP_RUN that ends the run everywhere.

Only this run's registered evaluators report results: anyone who reaches the topic bus can
publish an eval, so one is taken only from a live ``evaluator-<i>`` the roster planned and,
when the head started it, run by the process it started (``registered``).

Sockets: a SUB on the topic bus (``metrics``, ``eval``); throwaway DEALERs for STATUS and
STOP_RUN.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from zrl.config import ExperimentConfig
from zrl.metrics import MetricsWriter
from zrl.roles.base import RoleError, registry_request
from zrl.run.aggregator import Aggregator, count, number
from zrl.run.placement import BrokerAccess
from zrl.run.pool import ChildPool
from zrl.run.roster import Roster
from zrl.run.stop_rule import StopRule
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints, connect_topics
from zrl.transport.sockets import Channel, TransportStats, make_socket

log = logging.getLogger("zrl.supervisor")

REMOTE_STOP_WAIT_S = 20.0
"""How long the head keeps the broker up for roles elsewhere to hear the stop and say BYE."""


class TopicSource(Protocol):
    """What ``RunMonitor.drain`` reads: the SUB channel, or a test's feed of messages."""

    def recv(self, *, block: bool = True) -> tuple[bytes | None, P.Message] | None: ...

    def _drop(self, sender: str, reason: str) -> None: ...


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
    evals_dropped: int = field(default=0, init=False)
    """Evals published under a name that is no registered evaluator of this run."""
    first_env_step: float | None = field(default=None, init=False)
    """Seconds from the head's start to the first actor report of an env step."""

    def open(self) -> Channel:
        """The SUB on the topic bus for ``metrics`` and ``eval``."""
        endpoints = broker_endpoints(self.access.broker_addr, self.cfg.broker.streams)
        sock = make_socket(self.ctx, zmq.SUB, rcvhwm=10_000, rcvtimeo_ms=0, keys=self.access.keys,
                           max_message_bytes=self.cfg.broker.max_message_bytes)  # fmt: skip
        for topic in (P.METRICS_TOPIC, P.EVAL_TOPIC):
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        connect_topics(sock, endpoints)
        return Channel(sock, "monitor", "supervisor", TransportStats(), topics=True)

    def drain(self, source: TopicSource, writer: MetricsWriter, elapsed: float) -> None:
        """Everything ``source`` holds now: metrics to the aggregator, evals (of this run's
        evaluators) to ``writer`` and the stop rule."""
        while True:
            got = source.recv(block=False)
            if got is None:
                return
            meta, sender = got[1].meta, got[1].sender
            if meta.get("kind") == "eval":
                if self.registered(sender, "evaluator") is None:
                    self.evals_dropped += 1
                    source._drop(sender or "?", "eval from no registered evaluator of this run")
                    continue
                if number(meta.get("mean")) is None:
                    source._drop(sender or "?", "eval result without a numeric mean")
                    continue
                row = self.agg.on_eval(meta, elapsed)
                writer.write_eval(row)
                self.target.on_eval(row, sender)
            else:
                self.agg.on_metrics(meta)
                if (
                    self.first_env_step is None
                    and meta.get("role") == "actor"
                    and count(meta.get("env_steps")) > 0
                ):
                    # Actors report once a second: this is when we heard of the first step.
                    self.first_env_step = round(elapsed, 2)

    def registered(self, rid: Any, role: str) -> dict[str, Any] | None:
        """The broker's row for ``rid`` if it is one of this run's ``role`` roles, live, and
        (when we started it here) run by the process we started; else None."""
        if not isinstance(rid, str) or not rid.startswith(f"{role}-"):
            return None
        if rid not in self.roster.planned:
            return None
        row = next((r for r in self.status_rows if r.get("id") == rid), None)
        if row is None or row.get("role") != role or row.get("state") not in ("starting", "alive"):
            return None
        child = next((c for c in self.pool.children if c.name == rid), None)
        if child is not None and child.proc is not None and row.get("pid") != child.proc.pid:
            return None
        return row

    def refresh(self) -> bool:
        """Fetch the registry's rows; False when the broker did not answer in time (the
        rows are the previous ones)."""
        try:
            reply = registry_request(
                self.ctx, self.access.broker_addr, P.Message(P.STATUS), 0.5, self.access.keys
            )
        except RoleError:
            return False
        self.status_rows = reply.meta.get("roles", [])
        return True

    def final_row(self, row: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """The figures at the stop, from the roles' last heartbeats: metrics come once a
        second, so a run stopped between two of them would under-report what its roles did."""
        self.refresh()
        for r in self.status_rows:
            info = r.get("info")
            if isinstance(info, dict) and isinstance(r.get("id"), str) and r.get("state") != "dead":
                previous = self.agg.latest.get(r["id"], {})
                self.agg.on_metrics({**previous, **info, "id": r["id"], "role": r.get("role")})
        return self.agg.row(elapsed) if self.status_rows else row

    def stop_run(self, reason: str, elapsed: float) -> None:
        """Tell every role, wherever it runs, that the experiment is over (STOP_RUN), and keep
        the broker up until the roles elsewhere have said BYE or REMOTE_STOP_WAIT_S passed."""
        try:
            reply = registry_request(
                self.ctx, self.access.broker_addr,
                P.Message(P.STOP_RUN, meta={"token": self.pool.stop_token, "reason": reason}),
                2.0, self.access.keys,
            )  # fmt: skip
        except RoleError as exc:
            log.warning("could not tell the broker to stop the experiment: %s", exc)
            return
        if reply.kind != P.STOP_RUN:
            log.warning("the broker refused to stop the experiment: %s", reply.meta.get("reason"))
            return
        deadline = time.monotonic() + REMOTE_STOP_WAIT_S
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
