"""Which roles a run planned, where, and which of them took part.

The head (``zrl run``, or ``zrl start broker --run-dir``) starts some roles itself and
expects the rest to register from other hosts. ``Roster`` remembers every role the broker
ever listed during the run (the registry forgets ended ones after a while), says which
placed roles have not come yet, and when waiting for them has lasted too long. The summary
lists every role that took part, where, its restarts and last state, where it keeps its files
on its host (``checkpoint_dir``, for a role that keeps any), and every one that never came.

What it keeps is bounded by the plan: every planned role, and at most ``MAX_UNPLANNED`` ids
the plan does not name (host agents, roles started by hand; anyone who reaches the broker can
register under a new id), the rest counted in ``unplanned_not_listed``.

No sockets: it reads the registry rows the supervisor fetched with STATUS.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zrl.run.aggregator import count

HOST_AGENT_ROLE = "host"
"""The role a host agent (``zrl.run.host_agent.HostAgent``) registers as."""


def agent_child_reports(
    rows: list[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(a host agent's STATUS row, its report of one of its children) for every report the
    registry's ``rows`` carry; anything malformed is skipped."""
    for row in rows:
        info = row.get("info")
        if row.get("role") != HOST_AGENT_ROLE or not isinstance(info, dict):
            continue
        children = info.get("children")
        for child in children if isinstance(children, list) else []:
            if isinstance(child, dict):
                yield row, child


MAX_PATH_CHARS = 4096


def files_dir(row: dict[str, Any]) -> str | None:
    """Where a role keeps its files, on its own host, as its heartbeat says
    (``Role.keeps_files_in``); None for a role that keeps none (or says nothing usable)."""
    info = row.get("info")
    d = info.get("checkpoint_dir") if isinstance(info, dict) else None
    return d if isinstance(d, str) and 0 < len(d) <= MAX_PATH_CHARS else None


HERE = "here"
"""Where a role the head starts itself runs."""
ANY_HOST = "any host"
"""Where a role runs that the config does not place (a head that starts no roles)."""
MAX_UNPLANNED = 32
"""Ids the plan does not name that the roster keeps (and the summary lists)."""


@dataclass
class Roster:
    planned: dict[str, str]
    """Role id -> where it was placed (``HERE``, a host name of ``hosts``, or ``ANY_HOST``)."""
    wait_s: float | None
    """How long roles placed elsewhere may take to register; None: for ever."""
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Role id -> what the registry last said of it (host, pid, restarts, state, ...)."""
    unplanned_not_listed: int = 0
    """The most ids of one STATUS that the plan does not name and ``seen`` had no room for."""

    @classmethod
    def of(
        cls,
        local: list[tuple[str, int]],
        remote: dict[str, list[tuple[str, int]]],
        wait_s: float | None,
    ) -> Roster:
        planned = {f"{r}-{i}": HERE for r, i in local}
        for host, roles in remote.items():
            planned.update({f"{r}-{i}": host for r, i in roles})
        return cls(planned, wait_s)

    def update(self, rows: list[dict[str, Any]], elapsed: float) -> None:
        """Take the registry's rows (STATUS) at ``elapsed`` seconds into the run."""
        unplanned = sum(rid not in self.planned for rid in self.seen)
        not_listed = 0
        for r in rows:
            rid = r.get("id")
            if not isinstance(rid, str):
                continue
            if rid not in self.planned and rid not in self.seen:
                if unplanned >= MAX_UNPLANNED:
                    not_listed += 1
                    continue
                unplanned += 1
            known = self.seen.setdefault(rid, {"first_seen": round(elapsed, 1)})
            known.update(
                role=r.get("role"),
                host=r.get("host"),
                address=r.get("address") or None,
                pid=r.get("pid"),
                state=r.get("state"),
                # The registry counts a registration from a new process under a known id.
                restarts=max(count(r.get("restarts")), count(known.get("restarts"))),
            )
            files = files_dir(r)
            if files is not None:
                known["checkpoint_dir"] = files
        self.unplanned_not_listed = max(self.unplanned_not_listed, not_listed)
        self.count_agent_restarts(rows)

    def count_agent_restarts(self, rows: list[dict[str, Any]]) -> None:
        """Restarts of planned roles that a host agent (``zrl host``) reports of its children:
        a role it restarted moments before the run stopped has not registered again, so the
        registry has not counted that restart yet."""
        for _, child in agent_child_reports(rows):
            rid = child.get("id")
            if isinstance(rid, str) and rid in self.planned and rid in self.seen:
                known = self.seen[rid]
                known["restarts"] = max(count(known.get("restarts")), count(child.get("restarts")))

    def ended_here(self, exit_codes: dict[str, int | None]) -> None:
        """How the roles the head started ended (their exit codes, at the stop): a role
        stopped moments ago may still be ``alive`` in the registry's last rows."""
        for rid, code in exit_codes.items():
            if rid in self.seen and code is not None:
                self.seen[rid]["state"] = "stopped" if code == 0 else f"exited {code}"

    def missing(self) -> list[str]:
        """Roles placed elsewhere that never registered, in plan order."""
        return [
            rid for rid, where in self.planned.items() if where != HERE and rid not in self.seen
        ]

    def overdue(self, elapsed: float) -> list[str]:
        """The missing roles once the wait is over (empty before, or with no limit)."""
        if self.wait_s is None or elapsed < self.wait_s:
            return []
        return self.missing()

    def describe_missing(self) -> str:
        missing = self.missing()
        by_host: dict[str, list[str]] = {}
        for rid in missing:
            by_host.setdefault(self.planned[rid], []).append(rid)
        return "; ".join(f"{', '.join(ids)} ({host})" for host, ids in by_host.items())

    def still_running_elsewhere(self) -> list[str]:
        """Roles not started here that the registry last saw starting or alive."""
        return [
            rid
            for rid, known in self.seen.items()
            if self.planned.get(rid) != HERE and known.get("state") in ("starting", "alive")
        ]

    def summary(self, restarts_here: dict[str, int]) -> dict[str, Any]:
        """``roles`` of summary.json. ``restarts_here``: what the head itself restarted."""
        took_part = {}
        for rid, known in sorted(self.seen.items()):
            took_part[rid] = {
                **known,
                "placed": self.planned.get(rid, "unplanned"),
                "restarts": max(count(known.get("restarts")), restarts_here.get(rid, 0)),
            }
        never = [rid for rid in self.planned if rid not in self.seen]
        out: dict[str, Any] = {"took_part": took_part, "never_came": never}
        if self.unplanned_not_listed:
            out["unplanned_not_listed"] = self.unplanned_not_listed
        return out
