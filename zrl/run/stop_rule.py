"""When ``zrl run`` stops by itself: the target on evaluations (``stop.eval_return``, met by
the mean of a window of evaluations or by a confirming evaluation of fresh episodes) and the
limits (``stop.env_steps``, ``stop.wall_time``).

No sockets. Evaluations arrive on the open topic bus, where a sender's name can be forged,
so an evaluation that meets the rule is only a candidate until the evaluator's own heartbeat
(in the broker's STATUS, which the supervisor polls) reports the evaluations it was met with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from zrl.config.experiment import ExperimentConfig
from zrl.roles.evaluated_weights import KEEP_MET, rule_met
from zrl.run.aggregator import number


class StopRule:
    """The stop rule of one run, and when and how its target was met."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.target_time: float | None = None
        self.target_steps: int | None = None
        self.target_reached_at: float | None = None
        self.confirming_return: float | None = None
        """The mean that met the rule."""
        self.confirmed_by: str | None = None
        """The evaluator whose evaluations met the rule."""
        self.confirmed_version: int | None = None
        """The weights version of the evaluation that met the rule (the last of a window)."""
        # Evals that meet the stop rule, awaiting the evaluator's heartbeat:
        # (sender, row, time, the means that met it).
        self.candidates: list[tuple[str, dict[str, Any], float, list[float]]] = []
        self._eval_means: dict[str, list[float]] = {}  # per evaluator, for the window rule

    def describe(self) -> str:
        """The stop rule on evaluations, in words (for the summary and the README)."""
        s = self.cfg.stop
        if s.eval_return is None:
            return "no eval_return target"
        if s.confirm == "fresh":
            return (
                f"an evaluation reaches {s.eval_return:g}, then a confirming evaluation of "
                f"{s.eval_episodes} fresh episodes with the same weights reaches it too"
            )
        return f"the mean of the last {s.eval_window} evaluations reaches {s.eval_return:g}"

    def on_eval(self, row: dict[str, Any], sender: str) -> None:
        """Note an eval that meets the stop rule; `confirm` stops the run on it."""
        s = self.cfg.stop
        means = [*self._eval_means.get(sender, []), row["mean"]][-s.eval_window :]
        self._eval_means[sender] = means
        if s.eval_return is None or self.target_time is not None:
            return
        met = rule_met(s, means, row["confirming"])
        if met:
            self.candidates = [*self.candidates[-(KEEP_MET - 1) :], (sender, row, time.time(), met)]

    def confirm(self, evaluator_row: Callable[[str], dict[str, Any] | None]) -> bool:
        """Whether the target is met now: the evaluator's own heartbeat (its row in the
        broker's STATUS, from ``evaluator_row``; None if it is not one of this run's
        evaluators) reports the evaluations that met the rule too.

        The sender name of a topic-bus message can be forged; a heartbeat comes only from
        the connection the evaluator registered on (the broker drops others). It carries the
        means of the evaluator's latest evaluations (rounded to 2 places), and the latest
        confirming one: a candidate counts only if every mean it was met with is among them
        in that order, so no forged eval can complete a window."""
        target = self.cfg.stop.eval_return
        if target is None or self.target_time is not None:
            return False
        fresh = self.cfg.stop.confirm == "fresh"
        for sender, hit, wall, met in self.candidates:
            row = evaluator_row(sender)
            info = row.get("info") if row is not None else None
            if not isinstance(info, dict):
                continue
            mine: list[float | None] = [round(m, 2) for m in met]
            if fresh:
                reported = [number(info.get("confirming_return"))]
            else:
                recent = info.get("recent_returns")
                # An evaluator without the list (an older one) reports its latest mean only.
                reported = recent if isinstance(recent, list) else [info.get("eval_return")]
                reported = [number(v) for v in reported]
            runs = [reported[i : i + len(mine)] for i in range(len(reported) - len(mine) + 1)]
            if mine not in runs:
                continue
            self.target_time = hit["time"]
            self.target_reached_at = wall
            self.target_steps = hit["env_steps"]
            self.confirming_return = round(sum(met) / len(met), 2)
            self.confirmed_by = sender
            version = hit.get("weights_version")
            self.confirmed_version = version if isinstance(version, int) else None
            return True
        return False

    def limit_reached(self, row: dict[str, Any]) -> str | None:
        """``env_steps`` or ``wall_time`` when the progress row reached that limit."""
        s = self.cfg.stop
        if s.env_steps is not None and row["env_steps"] >= s.env_steps:
            return "env_steps"
        if s.wall_time is not None and row["time"] >= s.wall_time:
            return "wall_time"
        return None
