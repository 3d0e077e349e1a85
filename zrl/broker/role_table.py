"""The registry's role table: one entry per registered role id, how ids are numbered, which
HELLO may take over an id, and liveness (a role silent too long is marked dead; one that
heartbeats while its loop does not turn is shown stalled; dead and stopped entries are
forgotten). The registry (``zrl.broker.registry``) speaks the protocol around it.

Sockets: none.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zrl.broker.limits import (
    COUNTER_MAX,
    STATUS_ROW_INFO_BYTES,
    STATUS_ROW_STREAMS_BYTES,
    brief,
    for_log,
)
from zrl.config.sections import BrokerConfig
from zrl.transport.sockets import STAT_COUNTERS

log = logging.getLogger("zrl.broker")

MAX_DEAD_LOGGED = 10  # per liveness pass; 2,000 fake HELLOs going dead at once are one summary
MAX_STALLED_LOGGED = 10  # per liveness pass, likewise


@dataclass
class RoleEntry:
    """What the registry knows about one registered role."""

    id: str
    role: str
    host: str
    pid: int
    rpc: str
    routing_id: bytes
    address: str = ""
    instance: str = ""
    """A random name the role object picked (see RoleTable.earlier_hello)."""
    agent: str = ""
    """The id of the host agent that heartbeats for this role (``Registry``: it registered
    through that agent, on the agent's host), or "" when the role heartbeats itself."""
    state: str = "starting"  # starting | alive | dead | stopped
    registered: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    restarts: int = 0
    ended: float = 0.0  # monotonic time it went dead or stopped: forgotten forget_after later
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    totals: tuple[int, ...] = (0, 0, 0, 0)
    """``stats`` summed over streams, per STAT_COUNTERS (sent, received, dropped, gaps)."""
    brief_info: dict[str, Any] = field(default_factory=dict)
    """``info`` as a STATUS listing shows it (``limits.brief``, STATUS_ROW_INFO_BYTES)."""
    brief_stats: dict[str, Any] = field(default_factory=dict)
    loop: int | None = None
    """The turns of the role's loop its last heartbeat said (``loop``; None: it does not say)."""
    turned: float = field(default_factory=time.monotonic)
    """Monotonic time ``loop`` last changed (or a heartbeat without one came, or the HELLO)."""
    stalled: bool = False
    """It heartbeats, but its loop has not turned for ``stall_after`` (``setup_grace`` while it
    is starting): a long step, a hung one or a starved core. Shown, never acted on."""

    def heard_from(self, report: dict[str, Any], now: float) -> bool:
        """A heartbeat of this role (its own, or its host agent's report of it): alive now,
        except that one of its heartbeat thread (``loop`` but no ``info``: liveness alone)
        keeps a ``starting`` entry starting, and brings a dead one back as what it says it is;
        the first with its figures (from its loop, set up) makes it alive. ``loop`` tells
        whether its loop turned. True when it was dead."""
        revived = self.state == "dead"
        loop = report.get("loop")
        loop = loop if type(loop) is int else None  # not a bool, whatever a peer sends
        pulse = loop is not None and report.get("info") is None
        if pulse and self.state != "alive":
            says = report.get("state") == "starting"
            self.state = "starting" if self.state == "starting" or says else "alive"
        else:
            self.state = "alive"
        self.last_seen = now
        if loop is None or loop != self.loop:
            if self.stalled:
                log.info("%s turns its loop again after %.1fs stalled", self.id, now - self.turned)
            self.loop, self.turned, self.stalled = loop, now, False
        return revived

    def set_info(self, info: dict[str, Any]) -> None:
        self.info = info
        self.brief_info = brief(info, STATUS_ROW_INFO_BYTES)

    def set_stats(self, stats: dict[str, dict[str, int]]) -> None:
        # Summed once per heartbeat, not once per row of every STATUS (a STATUS of 1,000
        # roles is built in the registry's loop, and heartbeats wait behind it).
        self.stats = stats
        streams = stats.values()
        self.totals = tuple(
            min(sum(c.get(key, 0) for c in streams), COUNTER_MAX) for key in STAT_COUNTERS
        )
        self.brief_stats = brief(stats, STATUS_ROW_STREAMS_BYTES)

    def row(self, now: float, whole: bool = True) -> dict[str, Any]:
        """The entry as STATUS shows it: ``whole``, or as a listing does (info and stream
        counters cut to what fits: ``limits.brief``)."""
        sent, received, dropped, gaps = self.totals
        return {
            "id": self.id,
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "address": self.address,
            "rpc": self.rpc,
            "state": self.state,
            "age": round(now - self.last_seen, 2),
            "loop": self.loop,
            "stalled_s": round(now - self.turned, 1) if self.stalled else None,
            "restarts": self.restarts,
            "agent": self.agent,
            "msgs_in": received,
            "msgs_out": sent,
            "dropped": dropped,
            "gaps": gaps,
            "streams": self.stats if whole else self.brief_stats,
            "info": self.info if whole else self.brief_info,
        }


def may_replace(old: RoleEntry, ident: bytes, m: dict[str, Any]) -> bool:
    """Whether a HELLO for ``old``'s id may take the id over. A live entry belongs to the
    connection that registered it; a restarted role waits until the old one is dead."""
    if old.state in ("dead", "stopped") or old.routing_id == ident:
        return True
    # Before its first heartbeat a role retries HELLO on a new socket when the reply to
    # the first came late; it tells the same pid and host.
    return old.state == "starting" and old.pid == m["pid"] and old.host == m["host"]


class RoleTable:
    """The entries by id, within the ``broker`` section's limits (``max_roles``,
    ``heartbeat_timeout``, ``setup_grace``, ``forget_after``).

    ``planned``: the ids of the run's own roles (``<role>-<n>`` for n below the config's
    ``roles`` counts). Each has a slot whatever else registered: other ids fill at most
    ``max_roles`` less the planned ids not registered yet."""

    def __init__(self, limits: BrokerConfig, planned: frozenset[str] = frozenset()) -> None:
        self.limits = limits
        self.planned = planned
        self.entries: dict[str, RoleEntry] = {}
        self.counters: dict[str, int] = {}
        """The next number of each role name's automatic ids."""
        self._order: list[tuple[str, str]] | None = None
        """The entries' (role, id) in order, for STATUS pages; None: to sort again. Entries
        are added with ``put`` and removed with ``forget``, which keep it and ``_by_conn``."""
        self._by_conn: dict[bytes, set[str]] = {}
        """The ids registered from each connection (``held_by`` without a scan of the table:
        a HELLO storm of thousands of roles)."""

    def put(self, entry: RoleEntry) -> None:
        """Add (or replace) the entry of ``entry.id``."""
        old = self.entries.get(entry.id)
        if old is None or old.role != entry.role:
            self._order = None
        if old is not None:
            self._unlink(old)
        self.entries[entry.id] = entry
        self._by_conn.setdefault(entry.routing_id, set()).add(entry.id)

    def forget(self, rid: str) -> None:
        self._unlink(self.entries.pop(rid))
        self._order = None

    def _unlink(self, entry: RoleEntry) -> None:
        ids = self._by_conn.get(entry.routing_id)
        if ids is not None:
            ids.discard(entry.id)
            if not ids:
                del self._by_conn[entry.routing_id]

    def new_id(self, role: str, index: Any) -> tuple[str, int | None]:
        """(id, next number for ``role``; None when the id came from ``index``)."""
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return f"{role}-{index}", None
        n = self.counters.get(role, 0)
        while f"{role}-{n}" in self.entries and self.entries[f"{role}-{n}"].state == "alive":
            n += 1
        return f"{role}-{n}", n + 1

    def numbered(self, role: str, next_n: int) -> None:
        """An id numbered by ``new_id`` was given: the next one of ``role`` is ``next_n``."""
        if role not in self.counters and len(self.counters) >= self.limits.max_roles:
            self.counters.clear()  # numbering only skips live ids; it may start over
        self.counters[role] = next_n

    def earlier_hello(self, role: str, m: dict[str, Any]) -> RoleEntry | None:
        """The ``starting`` entry that this HELLO's role object already holds: its earlier
        HELLO, sent on another socket before the broker answered."""
        instance = m.get("instance")
        if not instance:
            return None
        for e in self.entries.values():
            if (e.role, e.state, e.pid, e.host, e.instance) == (
                role,
                "starting",
                m["pid"],
                m["host"],
                instance,
            ):
                return e
        return None

    def has_room(self, rid: str) -> bool:
        """Whether a new entry ``rid`` fits (forgetting the oldest ended entry, or for a
        planned id the newest unplanned one, to make room)."""
        if rid in self.planned:
            if len(self.entries) < self.limits.max_roles or self.forget_oldest_ended():
                return True
            return self.evict_newest_unplanned()
        reserved = sum(1 for p in self.planned if p not in self.entries)
        while len(self.entries) + reserved >= self.limits.max_roles:
            if not self.forget_oldest_ended():
                return False
        return True

    def evict_newest_unplanned(self) -> bool:
        """Forget the most recently registered entry that is not a planned role, to give
        its slot to a planned one."""
        unplanned = [e for e in self.entries.values() if e.id not in self.planned]
        if not unplanned:
            return False
        newest = max(unplanned, key=lambda e: e.registered)
        self.forget(newest.id)
        log.warning("forgot %s to make room for a planned role (registry full)", newest.id)
        return True

    def held_by(self, ident: bytes) -> int:
        """Live (starting or alive) entries registered from the connection ``ident``."""
        return sum(
            1
            for rid in self._by_conn.get(ident, ())
            if self.entries[rid].state in ("starting", "alive")
        )

    def forget_oldest_ended(self) -> bool:
        ended = [e for e in self.entries.values() if e.state in ("dead", "stopped")]
        if not ended:
            return False
        oldest = min(ended, key=lambda e: e.ended)
        self.forget(oldest.id)
        log.info("forgot %s (registry full)", oldest.id)
        return True

    def status_rows(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [e.row(now) for e in sorted(self.entries.values(), key=lambda e: (e.role, e.id))]

    def listing(
        self, after: tuple[str, str] | None, host: str | None = None, role: str | None = None
    ) -> Iterator[RoleEntry]:
        """The entries a STATUS listing pages through: in (role, id) order, past ``after``,
        of ``host`` and of ``role`` only when given. Lazily, from the kept order: a page of
        a big table costs its own rows, not a sort of the table."""
        if self._order is None:
            self._order = sorted((e.role, e.id) for e in self.entries.values())
        order = self._order
        start = bisect.bisect_right(order, after) if after is not None else 0
        for i in range(start, len(order)):
            e = self.entries.get(order[i][1])
            if e is None or e.role != order[i][0]:
                continue
            if (host is None or e.host == host) and (role is None or e.role == role):
                yield e

    def services(self, role: Any) -> list[dict[str, Any]]:
        """The rpc endpoints of the live ``role`` roles (a LOOKUP's answer)."""
        return [
            {"id": e.id, "rpc": e.rpc, "host": e.host}
            for e in self.entries.values()
            if e.role == role and e.state in ("starting", "alive") and e.rpc
        ]

    def check_liveness(self) -> None:
        now = time.monotonic()
        died = stalled = 0
        for e in list(self.entries.values()):
            # While a role sets up (imports, envs, models) its heartbeat thread may be silent:
            # before it starts, and while native code holds the GIL (building 8 ALE envs held
            # it 1.2 s on an idle core, over 10 s at load 20). setup_grace bounds that.
            starting = e.state == "starting"
            window = self.limits.setup_grace if starting else self.limits.heartbeat_timeout
            if e.state in ("starting", "alive") and now - e.last_seen > window:
                e.state = "dead"
                e.ended = now
                e.stalled = False
                died += 1
                if died <= MAX_DEAD_LOGGED:
                    log.warning(
                        "%s (host %s, pid %s) missed heartbeats for %.1fs: marked dead",
                        e.id,
                        for_log(e.host),
                        e.pid,
                        now - e.last_seen,
                    )
            elif e.state in ("starting", "alive") and not e.stalled:
                limit = (
                    self.limits.setup_grace if e.state == "starting" else self.limits.stall_after
                )
                if now - e.turned > limit:
                    e.stalled = True
                    stalled += 1
                    if stalled <= MAX_STALLED_LOGGED:
                        log.warning(
                            "%s (host %s, pid %s) heartbeats, but its loop has not turned for "
                            "%.1fs (%s): stalled",
                            e.id,
                            for_log(e.host),
                            e.pid,
                            now - e.turned,
                            "setting up" if e.state == "starting" else "a step that goes on",
                        )
            elif e.state in ("dead", "stopped") and now - e.ended > self.limits.forget_after:
                self.forget(e.id)
                log.info("forgot %s (%s for %.0fs)", e.id, e.state, now - e.ended)
        if died > MAX_DEAD_LOGGED:
            log.warning("%d more missed their heartbeats: marked dead", died - MAX_DEAD_LOGGED)
        if stalled > MAX_STALLED_LOGGED:
            log.warning("%d more stalled", stalled - MAX_STALLED_LOGGED)
