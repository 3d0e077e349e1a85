"""Whether a run learned: a run whose learners' weights never reached the actors failed, even
when every process stayed up (issue 27: one forged WEIGHTS once locked params for a whole run
and the summary said ``failed: false``).

No sockets: :func:`did_not_learn` reads the registry's last rows (each role's heartbeat info).
The head calls it when the run stops; a reason fails the run (``summary.json`` ``failed:
true`` and ``error``, exit code 1) unless the run met its target.

A learner's weights did not reach params when:

- it sent at least ``MIN_SENT`` WEIGHTS and params acknowledged at most one of them (the
  first is the initial weights: a run that never got past them did not learn), or
- it trained ``MIN_INTERVALS`` publish intervals and params' version of its policy is still
  at most 1.

Learners that never publish (DD-PPO's followers) and algorithms without learners (A3C, whose
params owns the weights) are not judged.

While the run goes, :class:`ProgressWatch` fails it as soon as its learning stopped for
``stop.no_progress`` seconds: a learner made updates, then none while the actors stepped (a
group stuck on a poisoned all-reduce, a learner hung), or trained on while params' version of
its policy stayed the same (its weights refused). A run that stopped learning never ends
``failed: false``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zrl.config.experiment import ExperimentConfig
from zrl.transport import messages as M

MIN_SENT = 3
MIN_INTERVALS = 3


def _count(info: dict[str, Any], key: str) -> int:
    value = info.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def did_not_learn(cfg: ExperimentConfig, rows: list[dict[str, Any]]) -> str | None:
    """Why the run did not learn, from the run's own registry rows (``rows``: the head's
    last STATUS, this run's planned roles only), or None."""
    params = next((r for r in rows if r.get("role") == "params"), None)
    params_info = params.get("info") if isinstance(params, dict) else None
    for row in rows:
        info = row.get("info")
        if row.get("role") != "learner" or not isinstance(info, dict):
            continue
        sent, acked = _count(info, "weights_sent"), _count(info, "weights_acked")
        updates = _count(info, "updates")
        if sent == 0:
            continue  # a learner that does not publish
        rid = row.get("id")
        if sent >= MIN_SENT and acked <= 1:
            return (
                f"{rid} did not learn: params acknowledged {acked} of the {sent} weights it "
                f"sent ({updates} updates), so its updates never reached the actors; see "
                "weights_refused in params' status"
            )
        policy = info.get("policy", M.DEFAULT_POLICY)
        key = "weights_version" if policy == M.DEFAULT_POLICY else f"weights_version_{policy}"
        version = _count(params_info, key) if isinstance(params_info, dict) else None
        trained = updates >= MIN_INTERVALS * cfg.learner.publish_interval
        if trained and version is not None and version <= 1:
            return (
                f"params' weights version of {policy!r} stayed at v{version} while {rid} "
                f"trained {updates} updates: the run did not learn"
            )
    return None


@dataclass
class _Seen:
    """A figure and since when it has not changed."""

    value: int
    since: float


@dataclass
class ProgressWatch:
    """Whether the run's learning stopped while it runs (see the module docstring). Feed it
    the run's own registry rows with ``observe``, which says why learning stopped, or None."""

    cfg: ExperimentConfig
    seen: dict[str, _Seen] = field(default_factory=dict)
    at_version: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per learner: params' version of its policy, and its updates when first seen at it."""

    def _note(self, key: str, value: int, now: float) -> _Seen:
        """The figure ``key``: its value and since when, reset when it changes."""
        seen = self.seen.get(key)
        if seen is None or seen.value != value:
            seen = self.seen[key] = _Seen(value, now)
        return seen

    def observe(self, rows: list[dict[str, Any]], now: float) -> str | None:
        """Why learning stopped, from this run's rows at ``now`` (monotonic seconds), or
        None while it goes on (or there is no limit)."""
        limit = self.cfg.stop.no_progress
        if limit is None:
            return None
        infos = [(r, r["info"]) for r in rows if isinstance(r.get("info"), dict)]
        steps = sum(_count(i, "env_steps") for r, i in infos if r.get("role") == "actor")
        actors = self._note("actors", steps, now)
        params = next((i for r, i in infos if r.get("role") == "params"), None)
        for row, info in infos:
            if row.get("role") != "learner" or row.get("state") != "alive":
                continue
            rid = str(row.get("id"))
            updates = _count(info, "updates")
            trained = self._note(f"{rid}/updates", updates, now)
            if updates >= 1 and now - trained.since >= limit and actors.since > trained.since:
                return (
                    f"{rid} made no update for stop.no_progress={limit:g}s (stuck at {updates} "
                    f"updates) while the actors stepped on to {steps} env steps: learning "
                    "stopped"
                )
            if params is None or _count(info, "weights_sent") == 0:
                continue  # a learner that does not publish
            policy = info.get("policy", M.DEFAULT_POLICY)
            key = "weights_version" if policy == M.DEFAULT_POLICY else f"weights_version_{policy}"
            version = self._note(f"params/{key}", _count(params, key), now)
            base = self.at_version.get(rid)
            if base is None or base[0] != version.value:
                self.at_version[rid] = (version.value, updates)
                continue
            grew = updates - base[1]
            if (
                now - version.since >= limit
                and grew >= MIN_INTERVALS * self.cfg.learner.publish_interval
            ):
                return (
                    f"params' weights version of {policy!r} stayed at v{version.value} for "
                    f"stop.no_progress={limit:g}s while {rid} trained {grew} updates: its "
                    "weights no longer reach the actors"
                )
        return None
