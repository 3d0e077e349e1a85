"""When ``zrl run`` stops by itself: the targets on evaluations (``stop.eval_return``,
``stop.exploitability`` and bounds on eval.csv's columns, ``stop.eval_at_least`` /
``eval_at_most``, met by a window of evaluations or by a confirming evaluation of fresh
episodes) and the limits (``stop.env_steps``, ``stop.wall_time``).

No sockets. Evaluations arrive on the open topic bus, where a sender's name can be forged,
so an evaluation that meets the rule is only a candidate until the evaluator's own heartbeat
(in the broker's STATUS, which the supervisor polls) reports the evaluations it was met with.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from typing import Any

from zrl.config.experiment import ConfigError, ExperimentConfig
from zrl.envs.multiagent.search import enumerable_game
from zrl.roles.evaluated_weights import KEEP_MET, rule_met
from zrl.run.aggregator import number
from zrl.run.metrics import eval_fields


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
        self._eval_exploits: dict[str, list[float | None]] = {}  # theirs, aligned
        self._eval_bounds: dict[str, list[bool | None]] = {}  # column bounds met, aligned
        s = cfg.stop
        if cfg.evaluator.exploitability is True and enumerable_game(cfg.env.id) is None:
            raise ConfigError(
                f"evaluator.exploitability: true, but {cfg.env.id} is no board game small enough "
                "to enumerate (tic-tac-toe is): set it to auto or false"
            )
        if s.exploitability is not None and (
            cfg.evaluator.exploitability is False or enumerable_game(cfg.env.id) is None
        ):
            raise ConfigError(
                f"stop.exploitability: {s.exploitability:g}, but the evaluator computes no "
                f"exploitability for {cfg.env.id} (evaluator.exploitability: "
                f"{cfg.evaluator.exploitability}; only board games small enough to enumerate, "
                "tic-tac-toe, have one)"
            )
        if s.has_bounds:
            written = eval_fields(cfg.model_dump(mode="json"))
            for key, bounds in (
                ("eval_at_least", s.eval_at_least),
                ("eval_at_most", s.eval_at_most),
            ):
                for name in bounds:
                    if name not in written:
                        near = difflib.get_close_matches(name, written, n=1)
                        hint = f"did you mean {near[0]}? " if near else ""
                        raise ConfigError(
                            f"stop.{key}: {name!r} is no column this run's evaluations write; "
                            f"{hint}they write: {', '.join(written)}"
                        )

    def describe(self) -> str:
        """The stop rule on evaluations, in words (for the summary and the README)."""
        s = self.cfg.stop
        if not s.on_evaluations:
            return "no eval_return target"
        if s.confirm == "fresh":
            targets = " and ".join(
                t
                for t in (
                    f"a mean return of {s.eval_return:g}" if s.eval_return is not None else "",
                    f"exploitability {s.exploitability:g}" if s.exploitability is not None else "",
                    bounds_text(self.bounds),
                )
                if t
            )
            return (
                f"an evaluation reaches {targets}, then a confirming evaluation of "
                f"{s.eval_episodes} fresh episodes with the same weights reaches it too"
            )
        parts = []
        if s.eval_return is not None:
            parts.append(
                f"the mean of the last {s.eval_window} evaluations reaches {s.eval_return:g}"
            )
        if s.exploitability is not None:
            parts.append(
                f"each of the last {s.eval_window} evaluations has exploitability at most "
                f"{s.exploitability:g}"
            )
        if s.has_bounds:
            parts.append(
                f"each of the last {s.eval_window} evaluations has {bounds_text(self.bounds)}"
            )
        return ", and ".join(parts)

    def reason(self) -> str:
        """summary.json's ``stop_reason`` when the rule on evaluations stopped the run: the
        first of its targets set (``eval_return``, ``exploitability``, ``eval_bounds``)."""
        s = self.cfg.stop
        if s.eval_return is not None:
            return "eval_return"
        return "exploitability" if s.exploitability is not None else "eval_bounds"

    @property
    def bounds(self) -> dict[str, Any]:
        """The column bounds, as summary.json's ``target_bounds`` holds them."""
        return {"at_least": self.cfg.stop.eval_at_least, "at_most": self.cfg.stop.eval_at_most}

    def on_eval(self, row: dict[str, Any], sender: str) -> None:
        """Note an eval that meets the stop rule; `confirm` stops the run on it."""
        s = self.cfg.stop
        means = [*self._eval_means.get(sender, []), row["mean"]][-s.eval_window :]
        self._eval_means[sender] = means
        found = number(row.get("exploitability"))
        exploits = [*self._eval_exploits.get(sender, []), found][-s.eval_window :]
        self._eval_exploits[sender] = exploits
        held = [*self._eval_bounds.get(sender, []), s.bounds_met(row)][-s.eval_window :]
        self._eval_bounds[sender] = held
        if not s.on_evaluations or self.target_time is not None:
            return
        met = rule_met(s, means, row["confirming"], exploits, held)
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
        in that order, so no forged eval can complete a window. With ``stop.exploitability``
        the heartbeat's exploitability of those evaluations must meet it too; with column
        bounds, the heartbeat must say those evaluations met them."""
        s = self.cfg.stop
        if not s.on_evaluations or self.target_time is not None:
            return False
        for sender, hit, wall, met in self.candidates:
            row = evaluator_row(sender)
            info = row.get("info") if row is not None else None
            if not isinstance(info, dict) or not self._reported(info, met):
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

    def _reported(self, info: dict[str, Any], met: list[float]) -> bool:
        """Whether the evaluator's heartbeat ``info`` reports the evaluations ``met`` (their
        means, rounded to 2 places, in order) and, with ``stop.exploitability``, their
        exploitability at most the target, and that they met the column bounds."""
        s = self.cfg.stop
        mine: list[float | None] = [round(m, 2) for m in met]
        exploits: list[Any]
        if s.confirm == "fresh":
            reported = [number(info.get("confirming_return"))]
            exploits = [info.get("confirming_exploitability")]
            held = [info.get("confirming_bounds_met")]
        else:
            recent = info.get("recent_returns")
            # An evaluator without the list (an older one) reports its latest mean only.
            reported = recent if isinstance(recent, list) else [info.get("eval_return")]
            reported = [number(v) for v in reported]
            found = info.get("recent_exploitability")
            exploits = found if isinstance(found, list) else []
            bounds = info.get("recent_bounds_met")
            held = bounds if isinstance(bounds, list) else []
        if s.exploitability is not None and len(exploits) != len(reported):
            return False
        if s.has_bounds and len(held) != len(reported):
            return False
        for i in range(len(reported) - len(mine) + 1):
            if reported[i : i + len(mine)] != mine:
                continue
            if s.has_bounds and not all(h is True for h in held[i : i + len(mine)]):
                continue
            if s.exploitability is None:
                return True
            window = [number(e) for e in exploits[i : i + len(mine)]]
            if all(e is not None and e <= s.exploitability for e in window):
                return True
        return False

    def limit_reached(self, row: dict[str, Any]) -> str | None:
        """``env_steps``, ``updates`` or ``wall_time`` when the progress row reached that
        limit."""
        s = self.cfg.stop
        if s.env_steps is not None and row["env_steps"] >= s.env_steps:
            return "env_steps"
        if s.updates is not None and row["updates"] >= s.updates:
            return "updates"
        if s.wall_time is not None and row["time"] >= s.wall_time:
            return "wall_time"
        return None


def bounds_text(bounds: dict[str, Any]) -> str:
    """Column bounds ``{"at_least": {column: bound}, "at_most": {...}}`` (``stop.eval_at_least``
    and ``eval_at_most``, summary.json's ``target_bounds``) in words."""
    parts = [f"{k} >= {v:g}" for k, v in (bounds.get("at_least") or {}).items()]
    parts += [f"{k} <= {v:g}" for k, v in (bounds.get("at_most") or {}).items()]
    return ", ".join(parts)
