"""The broker's registry: which roles are there, and where they can be reached.

Socket: ROUTER ``registry`` (P, the broker's base address). Roles say HELLO and get WELCOME
(their id, the experiment spec, the stream endpoints, the message size limits) or REFUSED
(with a reason), then HEARTBEAT (answered with HEARTBEAT_ACK, or UNKNOWN_ROLE) and BYE;
anyone may ask LOOKUP (a service's rpc endpoints) and STATUS (the role table, a page of at
most ``STATUS_PAGE_BYTES`` at a time, or one role's whole row).

The registry validates every message it reads (malformed ones are counted and dropped) and
bounds what it stores (``zrl.broker.limits``: entries, field sizes, heartbeat info; STATUS
replies queued for peers, ``ReplyBudget``). Dead and stopped entries are forgotten after
``forget_after`` seconds; the run's planned roles always keep a slot. An entry belongs to the
connection (ROUTER routing id) that registered it, which holds at most
``MAX_ENTRIES_PER_CONNECTION`` live ones: HELLO, HEARTBEAT and BYE for a live id from another
connection are dropped and counted. A role that misses its heartbeats for
``heartbeat_timeout`` (``setup_grace`` while it sets up) is marked dead; one whose
``loop`` stays the same for ``stall_after`` is shown stalled (``stalled_s``) and stays alive.

Host agents (``zrl host``, role ``host``) heartbeat for the roles they started: a role's
HELLO names its agent, which the registry takes only when it is a live ``host`` entry on the
role's own host, and the agent's HEARTBEAT carries one report per role registered under it
(docs/protocol.md, ``hello``, ``heartbeat`` and ``heartbeat_ack``). A HELLO without an id or
index from a role object (``instance``) that already holds a ``starting`` entry gets the
same id again: a role that said HELLO on several sockets before its broker was up registers
once.

Stopping: STOP_RUN with the broker's stop token (``ZRL_STOP_TOKEN``, which only the head and
the broker know) makes every HEARTBEAT_ACK carry ``stop`` and every HELLO REFUSED with
``stopped``; a broker without a token refuses every STOP_RUN. Identity: with the run secret
(``run_secret``) a HELLO registers an id only with the ``credential`` that proves it
(``zrl.transport.security.role_credential``); a wrong or missing one is REFUSED and counted
and changes nothing, a live entry under that id included. Without a secret (``--insecure``)
a role is whoever says its id first (docs/security.md, "Who a role is").

The table itself (entries, id numbering, which HELLO may take over an id, liveness and
forgetting) is ``zrl.broker.role_table``.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import psutil
import zmq

from zrl.broker.limits import (
    AGENT_ROLE,
    MAX_ENTRIES_PER_CONNECTION,
    MAX_FIELD_CHARS,
    MAX_ID_CHARS,
    MAX_INFO_ITEMS,
    MAX_PID,
    MAX_REPORTED_ROLES,
    STATUS_PAGE_BYTES,
    STATUS_REPLY_DRAIN_S,
    STATUS_REPLY_PEER_BYTES,
    STATUS_REPLY_TOTAL_BYTES,
    DropLog,
    clean_stats,
    for_log,
    info_fits,
    valid_name,
    valid_text,
)
from zrl.broker.role_table import RoleEntry, RoleTable, may_replace
from zrl.config.sections import BrokerConfig
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.security import Keys, credential_matches
from zrl.transport.sockets import Channel, ReplyBudget, make_socket
from zrl.utils.version import __version__

log = logging.getLogger("zrl.broker")

REGISTRY_POLL_MS = 100
BATCH_WINDOW_S = 0.004
"""The registry loop wakes at most once per this: at 1,000 roles heartbeats arrive every
millisecond, and a wake-up per message costs more than the message (cross-core wake-ups are
45-160 us here). Adds at most this much to a reply's latency."""
LIVENESS_CHECK_S = 0.25
# Registry messages are small (the largest, a heartbeat, is its info plus counters); the
# big reply, WELCOME with pickled factories, goes out, which MAXMSGSIZE does not limit.
REGISTRY_MAX_MESSAGE_BYTES = 2**20
# Per connection: a peer that asks and never reads holds at most this many replies.
REGISTRY_SNDHWM = 16
REGISTRY_RCVHWM = 64


def registry_socket(ctx: zmq.Context, max_message_bytes: int, keys: Keys | None) -> zmq.Socket:
    """The registry's ROUTER, unbound."""
    return make_socket(
        ctx,
        zmq.ROUTER,
        sndhwm=REGISTRY_SNDHWM,
        rcvhwm=REGISTRY_RCVHWM,
        max_message_bytes=max_message_bytes,
        keys=keys,
        server=True,
    )


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host (a zombie, exited but not reaped, counts
    as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.AccessDenied:  # another user's: it runs
        return False


class Registry:
    """The role table behind the ROUTER ``registry``. What a WELCOME tells a role and the
    broker's part of a STATUS reply come from the broker (``welcome``, ``broker_status``);
    its limits from the ``broker`` config section (``limits``: ``max_message_bytes``,
    ``heartbeat_timeout``, ``setup_grace``, ``max_roles``, ``max_info_bytes``,
    ``forget_after``)."""

    def __init__(
        self,
        channel: Channel,
        limits: BrokerConfig,
        *,
        drops: DropLog,
        welcome: Callable[[str], P.Message],
        broker_status: Callable[[], dict[str, Any]],
        stop_token: str | None = None,
        planned: frozenset[str] = frozenset(),
        run_secret: bytes | None = None,
    ) -> None:
        self.channel = channel
        self.stop_token = stop_token
        self.run_secret = run_secret
        self.stopped: str | None = None
        """Why the head stopped the experiment (STOP_RUN), or None while it runs."""
        self.limits = limits
        self.drops = drops
        self.welcome = welcome
        self.broker_status = broker_status
        self.table = RoleTable(limits, planned)
        self.status_budget = ReplyBudget(
            per_peer_bytes=STATUS_REPLY_PEER_BYTES,
            total_bytes=STATUS_REPLY_TOTAL_BYTES,
            drain_s=STATUS_REPLY_DRAIN_S,
        )
        """Bytes of STATUS listings and LOOKUP replies queued for peers: a peer that asks
        and never reads cannot grow the broker (``dropped``: replies not sent)."""
        self._header_bytes: int | None = None
        """The header size of the message being handled (it bounds its metadata's size)."""

    @staticmethod
    def _hello_problem(m: dict[str, Any]) -> str | None:
        """Why a HELLO's fields cannot be registered, or None."""
        if not valid_name(m["role"]):
            return f"role names are 1 to {MAX_ID_CHARS} printable characters"
        if not valid_text(m["host"]):
            return f"host names are at most {MAX_FIELD_CHARS} printable characters"
        if not 0 <= m["pid"] < MAX_PID:
            return "pid out of range"
        if m.get("agent") is not None and not valid_name(m["agent"]):
            return f"agent ids are 1 to {MAX_ID_CHARS} printable characters"
        for key in ("rpc", "address", "instance"):
            if m.get(key) is not None and not valid_text(m[key]):
                return f"{key} is at most {MAX_FIELD_CHARS} printable characters"
        wanted = m.get("id")
        if wanted is not None and not valid_name(wanted):
            return f"role ids are 1 to {MAX_ID_CHARS} printable characters"
        return None

    @property
    def roles(self) -> dict[str, RoleEntry]:
        """The entries by id (``RoleTable.entries``)."""
        return self.table.entries

    def status_rows(self) -> list[dict[str, Any]]:
        return self.table.status_rows()

    def _reply(self, to: bytes, kind: str, **meta: Any) -> None:
        self.channel.send(P.Message(kind, meta=meta), to=to, block=False)

    def _reject(self, sender: Any, reason: str, detail: str) -> None:
        """A registry message refused or dropped by the registry's rules: counted as dropped."""
        self.channel.stats.dropped += 1
        self.drops.note(sender, reason, detail)

    def _on_hello(self, ident: bytes, msg: P.Message) -> None:
        m = msg.meta
        P.require_meta(msg, {"role": str, "host": str, "pid": int})
        theirs = m.get("zrl_version")
        if theirs != __version__:
            self._reply(
                ident,
                P.REFUSED,
                reason=(
                    f"zrl version mismatch: this broker runs zrl {__version__}, "
                    f"the role runs zrl {theirs}"
                ),
            )
            return
        problem = self._hello_problem(m)
        if problem is not None:
            self._reply(ident, P.REFUSED, reason=f"bad HELLO: {problem}")
            self._reject(msg.sender, "bad hello", problem)
            return
        if self.stopped is not None:
            self._reply(
                ident,
                P.REFUSED,
                stopped=True,
                reason=f"the experiment has stopped ({self.stopped})",
            )
            return
        wanted = m.get("id")
        role = m["role"]
        next_n = None
        earlier = (
            None
            if wanted is not None or m.get("index") is not None
            else (self.table.earlier_hello(role, m))
        )
        if isinstance(wanted, str) and wanted.startswith(role + "-"):
            rid = wanted
        elif earlier is not None:
            rid = earlier.id
        else:
            rid, next_n = self.table.new_id(role, m.get("index"))
        if not valid_name(rid):
            reason = f"role ids are 1 to {MAX_ID_CHARS} printable characters"
            self._reply(ident, P.REFUSED, reason=f"bad HELLO: {reason}")
            self._reject(msg.sender, "bad hello", reason)
            return
        # An id the HELLO names (id, index) is proven for itself; one the registry numbers,
        # for the role's wildcard. Checked before anything changes: a live entry stays.
        claimed = rid if wanted is not None or m.get("index") is not None else f"{role}-*"
        if self.run_secret is not None and not credential_matches(
            self.run_secret, claimed, m.get("credential")
        ):
            reason = (
                f"no valid credential for {rid}: a role proves its id with the run's secret "
                "(start it with the run's --keys, or from `zrl run` / `zrl host`)"
            )
            self._reply(ident, P.REFUSED, reason=reason)
            self._reject(msg.sender, "hello without a valid credential", reason)
            return
        old = self.roles.get(rid)
        if old is not None and self._restarted(old, m):
            log.info(
                "%s: pid %s on %s exited; its restart (pid %s) takes the id over",
                rid,
                old.pid,
                for_log(old.host),
                m["pid"],
            )
        elif old is not None and not may_replace(old, ident, m):
            # No answer, not REFUSED: a legitimately restarted role keeps saying HELLO with
            # back-off, and is welcome once the old entry misses its heartbeats (marked dead).
            self._reject(
                rid,
                "hello for a live id",
                (
                    f"{rid} is registered by pid {old.pid} on {for_log(old.host)} from another "
                    f"connection and is {old.state}: ignored until it is dead or stopped"
                ),
            )
            return
        if (old is None or old.routing_id != ident) and (
            self.table.held_by(ident) >= MAX_ENTRIES_PER_CONNECTION
        ):
            reason = f"one connection registers at most {MAX_ENTRIES_PER_CONNECTION} live roles"
            self._reply(ident, P.REFUSED, reason=reason)
            self._reject(msg.sender, "too many roles on one connection", reason)
            return
        if old is None and not self.table.has_room(rid):
            reason = (
                f"the registry is full: {len(self.roles)} roles (broker.max_roles "
                f"{self.limits.max_roles}, of which the run's own roles keep "
                f"{len(self.table.planned)})"
            )
            self._reply(ident, P.REFUSED, reason=reason)
            self._reject(msg.sender, "registry full", reason)
            return
        if next_n is not None:
            self.table.numbered(role, next_n)
        restarts = 0
        if old is not None:
            # Same id from a new process: a restart. From the same process: a reconnect.
            restarts = old.restarts + (1 if old.pid != m["pid"] or old.host != m["host"] else 0)
        entry = RoleEntry(
            id=rid,
            role=role,
            host=m["host"],
            pid=m["pid"],
            rpc=m.get("rpc") or "",
            routing_id=ident,
            address=m.get("address") or "",
            instance=m.get("instance") or "",
            restarts=restarts,
            agent=self._agent_for(rid, m),
        )
        self.table.put(entry)
        log.info("registered %s (host %s, pid %s)", rid, entry.host, entry.pid)
        welcome = self.welcome(rid)
        welcome.meta["agent"] = entry.agent or None
        self.channel.send(welcome, to=ident, block=False)

    def _restarted(self, old: RoleEntry, m: dict[str, Any]) -> bool:
        """Whether a HELLO that proved ``old``'s id (so only with the run secret) comes from a
        restart of a process known to have exited: the old pid is gone from this host (the
        broker's own), or the host agent that started the old one names itself again from
        another pid (it restarts a role only once it exited). Then the restart need not wait
        ``heartbeat_timeout`` for the old entry to be marked dead."""
        if self.run_secret is None or old.state in ("dead", "stopped") or old.pid == m["pid"]:
            return False
        if old.agent and m.get("agent") == old.agent and old.host == m["host"]:
            return True
        return old.host == m["host"] == socket.gethostname() and process_gone(old.pid)

    def _agent_for(self, rid: str, m: dict[str, Any]) -> str:
        """The host agent that will heartbeat for a role saying HELLO: the ``agent`` it names,
        when that is a live entry of role ``host`` on the role's own host; else "" (the role
        heartbeats itself). The registry decides, and the WELCOME tells the role."""
        aid = m.get("agent")
        if aid is None or aid == rid:
            return ""
        agent = self.roles.get(aid)
        if (
            agent is None
            or agent.role != AGENT_ROLE
            or agent.state not in ("starting", "alive")
            or agent.host != m["host"]
        ):
            self.drops.note(
                rid,
                "hello under an unknown agent",
                f"{for_log(aid)} is no live host agent on {for_log(m['host'])}: "
                "the role heartbeats itself",
            )
            return ""
        return agent.id

    def _on_heartbeat(self, ident: bytes, msg: P.Message) -> None:
        rid = msg.meta.get("id")
        entry = self.roles.get(rid) if isinstance(rid, str) else None
        if entry is None or entry.state == "stopped":
            self._reply(ident, P.UNKNOWN_ROLE, id=rid)
            return
        if entry.routing_id != ident:
            if entry.state == "dead":
                # Its owner reconnected on a new socket: have it say HELLO again.
                self._reply(ident, P.UNKNOWN_ROLE, id=rid)
                return
            self._reject(
                rid,
                "heartbeat from another connection",
                (
                    f"{rid} registered on another connection: a forged sender id, or the role "
                    "reconnected (it is welcome again once the old entry is dead)"
                ),
            )
            return
        now = time.monotonic()
        reports = msg.meta.get("roles")
        # A lone heartbeat's header bounds its info; a host agent's carries many infos.
        if self._beat(entry, msg.meta, now, self._header_bytes if reports is None else None):
            log.warning("%s is heartbeating again after being marked dead", rid)
        ack: dict[str, Any] = {}
        seq = M.heartbeat_seq(msg.meta)
        if seq is not None:  # echoed: the role matches acks to beats
            ack["seq"] = seq
        if reports is not None:
            ack["unknown"] = self._on_reports(entry, reports, now)
        if self.stopped is not None:
            ack["stop"] = self.stopped
        self._reply(ident, P.HEARTBEAT_ACK, **ack)

    def _beat(
        self, entry: RoleEntry, report: dict[str, Any], now: float, within: int | None
    ) -> bool:
        """One heartbeat of ``entry``: alive now (``RoleEntry.heard_from``: or still starting,
        and whether its loop turned), with the counters and info of ``report`` (``within``: a
        size that bounds the packed info, or None to measure it). True when the entry was
        dead."""
        revived = entry.heard_from(report, now)
        entry.set_stats(clean_stats(report.get("stats"), entry.stats))
        info = report.get("info")
        if isinstance(info, dict):
            if info_fits(info, self.limits.max_info_bytes, within):
                entry.set_info(info)
            else:
                # The heartbeat still counts: a role must not die of its own status.
                self.drops.note(
                    entry.id,
                    "heartbeat info too large",
                    (
                        f"more than {self.limits.max_info_bytes} bytes or {MAX_INFO_ITEMS} items; "
                        "keeping the previous info"
                    ),
                )
        return revived

    def _on_reports(self, agent: RoleEntry, reports: Any, now: float) -> list[str]:
        """A host agent's heartbeat for its roles (meta ``roles``: ``[{id, stats, info}]``):
        each role registered under this agent, on its host, is alive now with those figures.
        A report for any other role is dropped and counted; the ids the agent should tell
        to say HELLO again (unknown, stopped, or not this agent's) are returned."""
        if agent.role != AGENT_ROLE:
            self._reject(agent.id, "role reports from a non-agent", f"{agent.role} is no agent")
            return []
        if not isinstance(reports, list) or len(reports) > MAX_REPORTED_ROLES:
            self._reject(
                agent.id,
                "bad role reports",
                f"roles is a list of at most {MAX_REPORTED_ROLES} reports",
            )
            return []
        unknown: list[str] = []
        revived = 0
        for report in reports:
            rid = report.get("id") if isinstance(report, dict) else None
            if not isinstance(rid, str) or not valid_name(rid):
                self._reject(agent.id, "bad role reports", "a report without a role id")
                continue
            entry = self.roles.get(rid)
            if entry is None or entry.state == "stopped":
                unknown.append(rid)
            elif entry.agent != agent.id or entry.host != agent.host:
                self._reject(
                    agent.id,
                    "report for a role of another agent",
                    f"{rid} did not register through {agent.id} on {for_log(agent.host)}",
                )
                unknown.append(rid)
            else:
                assert isinstance(report, dict)
                revived += self._beat(entry, report, now, None)
        if revived:  # one line for an agent's roles: a late agent revives them all at once
            log.warning(
                "%d role(s) reported by %s are alive again after being marked dead",
                revived,
                agent.id,
            )
        return unknown

    def _on_bye(self, ident: bytes, msg: P.Message) -> None:
        rid = msg.meta.get("id")
        entry = self.roles.get(rid) if isinstance(rid, str) else None
        if entry is None or entry.state == "stopped":
            return  # e.g. a role stopping while its broker restarted
        if entry.routing_id != ident:
            self._reject(rid, "bye from another connection", f"{rid} registered on another one")
            return
        entry.state = "stopped"
        entry.ended = time.monotonic()
        entry.set_stats(clean_stats(msg.meta.get("stats"), entry.stats))
        log.info("%s said bye", rid)

    def _on_status(self, ident: bytes, msg: P.Message) -> None:
        """One page of the role table (meta ``after``: the ``[role, id]`` the last page ended
        at; ``host``, ``role``: that host's or role's rows only), or one role's whole row
        (meta ``id``). A page holds rows up to STATUS_PAGE_BYTES, their info cut to what a
        listing shows; the reply says ``more`` when rows remain (ask again with ``after``:
        ``last``). Listings count against ``status_budget``; one role's row does not."""
        m = msg.meta
        broker = {**self.broker_status(), "stopped": self.stopped}
        now = time.monotonic()
        rid = m.get("id")
        if rid is not None:
            if not valid_name(rid):
                raise P.ProtocolError(f"status id {for_log(rid)} is not a role id")
            entry = self.roles.get(rid)
            whole = [entry.row(now)] if entry is not None else []
            self._reply(ident, P.STATUS_REPLY, roles=whole, broker=broker, more=False)
            return
        after, host, role = m.get("after"), m.get("host"), m.get("role")
        if after is not None and not (
            isinstance(after, list) and len(after) == 2 and all(valid_name(a) for a in after)
        ):
            raise P.ProtocolError(f"status after {for_log(str(after))} is not [role, id]")
        if host is not None and not valid_text(host):
            raise P.ProtocolError(f"status host {for_log(host)} is not a host name")
        if role is not None and not valid_name(role):
            raise P.ProtocolError(f"status role {for_log(role)} is not a role name")
        rows: list[dict[str, Any]] = []
        used = len(msgpack.packb(broker, use_bin_type=True, default=str)) + 256
        more = False
        for entry in self.table.listing(tuple(after) if after else None, host, role):
            row = entry.row(now, whole=False)
            size = len(msgpack.packb(row, use_bin_type=True, default=str))
            if rows and used + size > STATUS_PAGE_BYTES:
                more = True
                break
            rows.append(row)
            used += size
        last = [rows[-1]["role"], rows[-1]["id"]] if rows else None
        reply = P.Message(
            P.STATUS_REPLY,
            meta={"roles": rows, "broker": broker, "more": more, "last": last},
        )
        over = self.status_budget.dropped
        if self.channel.send(reply, to=ident, block=False, budget=self.status_budget):
            return
        if self.status_budget.dropped > over:
            self.drops.note(
                msg.sender,
                "status reply over budget",
                (
                    f"{self.status_budget.queued} bytes of STATUS replies unread by peers; "
                    f"{self.status_budget.dropped} replies not sent"
                ),
            )
        else:
            self.drops.note(
                msg.sender,
                "status reply queue full",
                (f"the peer has {REGISTRY_SNDHWM} replies unread"),
            )

    def _on_stop_run(self, ident: bytes, msg: P.Message) -> None:
        P.require_meta(msg, {"token": str, "reason": str})
        token, reason = msg.meta["token"], msg.meta["reason"]
        # As bytes: compare_digest raises on a str that is not ASCII, and tokens come off the wire.
        if self.stop_token is None or not hmac.compare_digest(
            token.encode(), self.stop_token.encode()
        ):
            self._reply(ident, P.REFUSED, reason="stop_run: wrong stop token")
            self._reject(msg.sender, "bad stop token", "a STOP_RUN without this broker's token")
            return
        if self.stopped is None:
            text = reason[:MAX_FIELD_CHARS]
            self.stopped = text if text and valid_text(text) else "stopped"
            log.info("the head stopped the experiment (%s): telling every role", self.stopped)
        self._reply(ident, P.STOP_RUN, reason=self.stopped)

    def _on_lookup(self, ident: bytes, msg: P.Message) -> None:
        role = msg.meta.get("role")
        reply = P.Message(
            P.LOOKUP_REPLY, meta={"role": role, "services": self.table.services(role)}
        )
        # As large as a listing when many entries name one role: the same budget.
        if not self.channel.send(reply, to=ident, block=False, budget=self.status_budget):
            self.drops.note(msg.sender, "lookup reply not sent", "over budget or queue full")

    def _handle(self, ident: bytes, msg: P.Message) -> None:
        handler = {
            P.HELLO: self._on_hello,
            P.HEARTBEAT: self._on_heartbeat,
            P.BYE: self._on_bye,
            P.STATUS: self._on_status,
            P.LOOKUP: self._on_lookup,
            P.STOP_RUN: self._on_stop_run,
        }.get(msg.kind)
        if handler is None:
            raise P.ProtocolError(f"registry does not serve {msg.kind!r}")
        handler(ident, msg)

    def _recv(self) -> tuple[bytes, P.Message] | None:
        try:
            frames = self.channel.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if len(frames) < 2:
            self.channel.drop("?", "no routing envelope")
            return None
        ident = frames[0].bytes
        self._header_bytes = len(frames[1])
        if sum(len(f) for f in frames[1:]) > self.channel.max_message_bytes:
            # What MAXMSGSIZE does over tcp and ipc, for inproc too (a host agent's report
            # is the one registry message that grows).
            self.channel.drop(
                P.peek_sender(frames[1:]),
                f"a registry message over {self.channel.max_message_bytes} bytes",
            )
            return None
        try:
            # The ROUTER's own bound (REGISTRY_MAX_MESSAGE_BYTES), which MAXMSGSIZE does not
            # apply over inproc.
            msg = P.decode(frames[1:], max_bytes=self.channel.max_message_bytes)
        except P.VersionMismatch as exc:
            # Answer so the peer can say exactly which versions disagree.
            self._reply(ident, P.REFUSED, reason=str(exc), protocol=P.PROTOCOL_VERSION)
            self.channel.drop(P.peek_sender(frames[1:]), str(exc))
            return None
        except P.ProtocolError as exc:
            self.channel.drop(P.peek_sender(frames[1:]), str(exc))
            return None
        self.channel.stats.received += 1
        return ident, msg

    def serve(self, stop: threading.Event) -> None:
        """Answer registry messages and mark silent roles dead until ``stop`` is set."""
        poller = zmq.Poller()
        poller.register(self.channel.sock, zmq.POLLIN)
        next_check = time.monotonic()
        woke = 0.0
        while not stop.is_set():
            if poller.poll(REGISTRY_POLL_MS):
                since = time.monotonic() - woke
                if since < BATCH_WINDOW_S:  # busy: let a few more arrive, then read them all
                    time.sleep(BATCH_WINDOW_S - since)
                woke = time.monotonic()
                for _ in range(1000):  # drain a burst, but keep checking liveness
                    got = self._recv()
                    if got is None:
                        break
                    try:
                        self._handle(*got)
                    except P.ProtocolError as exc:
                        self.channel.drop(got[1].sender or "?", str(exc))
                    except Exception as exc:  # noqa: BLE001 - one message must not stop the broker
                        log.exception("registry failed on %s from %s", got[1].kind, got[1].sender)
                        self.channel.drop(got[1].sender or "?", f"handler error: {exc!r}")
            if time.monotonic() >= next_check:
                self.table.check_liveness()
                next_check = time.monotonic() + LIVENESS_CHECK_S
