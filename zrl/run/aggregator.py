"""The figures of ``zrl run``: the roles' latest metrics turned into what the live status,
``progress.csv``, ``eval.csv`` and the summary show.

No sockets: the monitor (``zrl.run.monitor``) feeds it the roles' counters from their
heartbeats (the registry's STATUS rows: a heartbeat comes only from the connection that
registered its id), their training figures from ``metrics`` on the topic bus, and the
evaluations from ``eval``. That bus is open to anyone who reaches the broker, so every figure
is checked here (``count``, ``number``), a malformed one counts as nothing, and what the head
keeps is bounded: figures of the run's planned roles only (``roles``, the roster), at most
``MAX_TRAIN_TAGS`` training tags per role kind.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

from zrl.run.metrics import ALL_EXPLOITABILITY_RANGES, ALL_OUTCOME_FIELDS


def count(value: Any) -> int:
    """A non-negative integer figure from a peer's metrics; anything else counts as 0.

    Metrics arrive on the open topic bus: a malformed one must not end the run."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0


def number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


TRAIN_ROLES = (
    "learner",
    "actor",
    "params",
    "replay",
    "evaluator",
    "league",
    "inference",
    "pbt",
)
TRAIN_KEY = re.compile(r"[a-z][a-z0-9_]{0,47}")
MAX_TRAIN_KEYS = 64
MAX_TRAIN_TAGS = 64
"""Distinct training figures the head keeps per role kind (``<role>/<name>`` tags in the CSV,
TensorBoard, W&B, MLflow); later new names are dropped (``train_dropped``)."""


WIRE_PATHS = {
    "trajectories": ("actor", "experience"),
    "rollouts": ("actor", "rollouts"),
    "gradients": ("actor", "gradients"),
    "batches": ("replay", "batches"),
}
"""The experience paths: their name in summary.json's ``wire`` -> (the role kind that sends on
it, the stream it reports as ``wire_bytes_<stream>``)."""


def eval_age(evaluation: dict[str, Any], elapsed: float) -> float | None:
    """Seconds from an evaluation's record (its ``time``) to ``elapsed``; None without one."""
    at = evaluation.get("time")
    return round(elapsed - at, 1) if isinstance(at, int | float) else None


class Aggregator:
    """Turns the roles' latest metrics into the figures the display and CSV show."""

    def __init__(self, roles: Collection[str] | None = None) -> None:
        self.roles = frozenset(roles) if roles is not None else None
        """The ids whose figures count (the run's planned roles); None: any (tests)."""
        # Training figures (``train`` in METRICS) reported since the last train_row, per role.
        self._train: dict[str, tuple[str, dict[str, float]]] = {}
        self._tags: dict[str, set[str]] = {}  # per role kind: the training figures kept
        self.train_dropped = 0
        """Training figures dropped: a new name past ``MAX_TRAIN_TAGS`` for its role kind."""
        self.dropped = 0
        """Reports of an id that is none of ``roles``."""
        self.latest: dict[str, dict[str, Any]] = {}
        self._carry: dict[tuple[str, str], int] = {}
        self._last_raw: dict[tuple[str, str], int] = {}
        self._history: list[tuple[float, int, int, int]] = []
        """(time, env steps, updates, samples trained) of the last ~5 s of rows: the rates."""
        self.evals: list[dict[str, Any]] = []
        self.env_steps_offset = 0

    def _counts(self, rid: str) -> bool:
        """Whether figures of ``rid`` count (one of ``roles``); counted in ``dropped`` if not."""
        if self.roles is not None and rid not in self.roles:
            self.dropped += 1
            return False
        return True

    def on_metrics(self, meta: dict[str, Any]) -> None:
        """A role's figures (``id``, ``role``, counters; ``train``: its training figures)."""
        rid = meta.get("id")
        if isinstance(rid, str) and self._counts(rid):
            self.latest[rid] = meta
            self.on_train(rid, meta.get("role"), meta.get("train"))

    def on_train(self, rid: str, role: Any, train: Any) -> None:
        """The training figures of role ``rid`` (of kind ``role``) since its last report."""
        if not isinstance(train, dict) or role not in TRAIN_ROLES or not self._counts(rid):
            return
        kept = self._tags.setdefault(role, set())
        figures: dict[str, float] = {}
        # From the open topic bus: short snake_case names and finite numbers only.
        for k, v in list(train.items())[:MAX_TRAIN_KEYS]:
            if not isinstance(k, str) or not TRAIN_KEY.fullmatch(k) or number(v) is None:
                continue
            if k not in kept:
                if len(kept) >= MAX_TRAIN_TAGS:
                    self.train_dropped += 1
                    continue
                kept.add(k)
            figures[k] = float(v)
        if figures:
            self._train[rid] = (role, figures)

    def train_row(self) -> dict[str, float]:
        """The training figures reported since the last call, as ``<role>/<name>`` tags,
        aggregated over the roles of a kind: ``*_min`` by min, ``*_max`` by max, the rest by
        the mean (of each role's running mean since its last report)."""
        gathered: dict[str, list[float]] = {}
        for role, figures in self._train.values():
            for k, v in figures.items():
                gathered.setdefault(f"{role}/{k}", []).append(v)
        self._train = {}
        out = {}
        for tag, values in sorted(gathered.items()):
            if tag.endswith("_min"):
                out[tag] = min(values)
            elif tag.endswith("_max"):
                out[tag] = max(values)
            else:
                out[tag] = sum(values) / len(values)
        return out

    def _monotonic_sum(self, role: str, key: str) -> int:
        """Sum of a counter over roles, carried across restarts (a restarted role counts from
        0). A role whose latest report lacks the counter keeps its last count: a role the
        broker marked dead registers again with an empty heartbeat, and its env steps did not
        go away (eval.csv once read 0 env steps for an evaluation in the middle of a run)."""
        total = 0
        for rid, m in self.latest.items():
            if m.get("role") != role:
                continue
            k = (rid, key)
            if isinstance(m.get(key), int):
                raw = count(m[key])
                if raw < self._last_raw.get(k, 0):
                    self._carry[k] = self._carry.get(k, 0) + self._last_raw[k]
                self._last_raw[k] = raw
            total += self._last_raw.get(k, 0) + self._carry.get(k, 0)
        return total

    def experience(self) -> dict[str, int]:
        """The actors' delivery ledgers beside what the replay shards received. An actor
        counts a trajectory delivered only on the shard's ack of exactly that trajectory, so
        ``sent = delivered + lost + in_flight`` per actor, and ``received_by_replay`` matches
        ``delivered`` up to what was acked between two heartbeats. Anything taking experience
        off the stream but a shard shows up as ``lost``."""
        got = {}
        for unit in ("trajectories", "steps"):

            def actors(key: str, unit: str = unit) -> int:
                return self._monotonic_sum("actor", f"{unit}_{key}")

            got[f"{unit}_sent"] = actors("sent")
            got[f"{unit}_delivered"] = actors("delivered")
            # Acked after being counted lost: delivered after all.
            got[f"{unit}_lost"] = max(actors("lost") - actors("late"), 0)
            got[f"{unit}_received_by_replay"] = self._monotonic_sum("replay", f"{unit}_received")
        got["trajectories_in_flight"] = sum(count(m.get("in_flight")) for m in self._of("actor"))
        return got

    def wire(self) -> dict[str, dict[str, float]]:
        """What each experience path carried, as the roles that send on it count it (every
        frame of every message sent, headers included): ``bytes``, the ``env_steps`` the
        actors had taken at their last report, and ``bytes_per_env_step``. Paths
        (``WIRE_PATHS``): trajectories from the actors to replay, rollouts from the actors to
        the learners, gradients from the A3C actors, batches from replay to the learners;
        those that carried nothing are left out."""
        env_steps = self._monotonic_sum("actor", "env_steps")
        out: dict[str, dict[str, float]] = {}
        for path, (role, stream) in WIRE_PATHS.items():
            sent = self._monotonic_sum(role, f"wire_bytes_{stream}")
            if sent:
                per_step = round(sent / env_steps, 1) if env_steps else 0.0
                out[path] = {"bytes": sent, "env_steps": env_steps, "bytes_per_env_step": per_step}
        return out

    def last_heartbeats(self) -> dict[str, dict[str, float]]:
        """Each role's numeric counters from its last heartbeat (a restarted role's count from
        its restart), by role id: summary.json's ``heartbeats``. The figures of the roster's
        roles only, at most ``MAX_TRAIN_KEYS`` short snake_case names each."""
        out: dict[str, dict[str, float]] = {}
        for rid, meta in sorted(self.latest.items()):
            figures: dict[str, float] = {}
            for k, v in list(meta.items())[:MAX_TRAIN_KEYS]:
                if isinstance(k, str) and TRAIN_KEY.fullmatch(k) and number(v) is not None:
                    figures[k] = v
            out[rid] = figures
        return out

    def _of(self, role: str) -> list[dict[str, Any]]:
        return [m for m in self.latest.values() if m.get("role") == role]

    def row(self, elapsed: float) -> dict[str, Any]:
        env_steps = self.env_steps_offset + self._monotonic_sum("actor", "env_steps")
        updates = self._monotonic_sum("learner", "updates")
        trained = self._monotonic_sum("learner", "samples_trained")
        self._history.append((elapsed, env_steps, updates, trained))
        # Rates over the last ~5 s, so the display reacts but does not flicker.
        while len(self._history) > 2 and elapsed - self._history[0][0] > 5.0:
            self._history.pop(0)
        t0, s0, u0, n0 = self._history[0]
        dt = max(elapsed - t0, 1e-6)
        rated = len(self._history) > 1
        replays = self._of("replay")
        inserts = sum(count(m.get("inserts")) for m in replays)
        samples = sum(count(m.get("samples")) for m in replays)
        params = self._of("params")
        version = max((count(m.get("weights_version")) for m in params), default=0)
        actor_versions = [count(m.get("weights_version")) for m in self._of("actor")]
        return {
            "time": round(elapsed, 2),
            "env_steps": env_steps,
            "env_steps_per_s": round((env_steps - s0) / dt, 1) if rated else 0.0,
            "updates": updates,
            "samples_trained": trained,
            "samples_trained_per_s": round((trained - n0) / dt, 1) if rated else 0.0,
            "updates_per_s": round((updates - u0) / dt, 1) if rated else 0.0,
            "replay_size": sum(count(m.get("size")) for m in replays),
            "samples_per_insert": round(samples / inserts, 2) if inserts else 0.0,
            "weights_version": version,
            # Metrics arrive at different moments: an actor may report a version params has not.
            "max_version_lag": max((max(version - v, 0) for v in actor_versions), default=0),
            "eval_return": self.evals[-1]["mean"] if self.evals else None,
            # The last evaluation's weights version and age: a return is of the weights it
            # played, measured when it ended, not of the weights training now.
            "eval_version": self.evals[-1].get("weights_version") if self.evals else None,
            "eval_age_s": eval_age(self.evals[-1], elapsed) if self.evals else None,
        }

    def on_eval(self, meta: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """Record an evaluation (one whose ``mean`` is a number) and return its eval.csv row."""
        row: dict[str, Any] = {k: number(meta.get(k)) for k in ("mean", "std", "min", "max")}
        row["std"] = row["std"] or 0.0
        row["weights_version"] = count(meta.get("weights_version"))
        row["episodes"] = count(meta.get("episodes"))
        row["time"] = round(elapsed, 2)
        row["env_steps"] = self.row(elapsed)["env_steps"]
        row["confirming"] = meta.get("confirming") is True
        for key in ALL_OUTCOME_FIELDS:
            share = number(meta.get(key))
            if share is not None and 0.0 <= share <= 1.0:
                row[key] = share
        # A small board game's exploitability (EXPLOITABILITY_FIELDS, and the search
        # player's), each in its range.
        for key, low, high in ALL_EXPLOITABILITY_RANGES:
            value = number(meta.get(key))
            if value is not None and low <= value <= high:
                row[key] = value
        self.evals.append(row)
        return row
