"""``StopRule``: its limits (env steps, updates, wall time), and exploitability
(``stop.exploitability``): met by a window of evaluations or a confirming one, only once the
evaluator's own heartbeat reports the same evaluations and their exploitability; refused at
once where no evaluation computes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zrl.config.experiment import ConfigError, ExperimentConfig, load_config
from zrl.run.stop_rule import StopRule

REPO = Path(__file__).resolve().parents[2]


def tictactoe(*overrides: str) -> ExperimentConfig:
    """The shipped league config without its stop rule (stop.exploitability: 0) unless given."""
    base = ["stop.exploitability=null"]
    return load_config(REPO / "configs" / "tictactoe_league.yaml", [*base, *overrides])


class Evaluator:
    """evaluator-0 as the head hears it: its evals on the topic bus (``StopRule.on_eval``)
    and its heartbeat (the info ``StopRule.confirm`` reads)."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.info: dict[str, Any] = {}

    def evaluate(
        self,
        mean: float,
        exploitability: float | None,
        confirming: bool = False,
        columns: dict[str, float] | None = None,
    ) -> None:
        row: dict[str, Any] = {
            **(columns or {}),
            "mean": mean,
            "confirming": confirming,
            "time": float(len(self.info.get("recent_returns", [])) + 1),
            "env_steps": 100,
            "weights_version": 7,
        }
        if exploitability is not None:
            row["exploitability"] = exploitability
        self.rule.on_eval(row, "evaluator-0")
        self.info["recent_returns"] = [*self.info.get("recent_returns", []), round(mean, 2)]
        self.info["recent_exploitability"] = [
            *self.info.get("recent_exploitability", []),
            exploitability,
        ]
        held = self.rule.cfg.stop.bounds_met(row)
        self.info["recent_bounds_met"] = [*self.info.get("recent_bounds_met", []), held]
        if confirming:
            self.info["confirming_return"] = round(mean, 2)
            self.info["confirming_exploitability"] = exploitability
            self.info["confirming_bounds_met"] = held

    def confirm(self) -> bool:
        return self.rule.confirm(lambda sender: {"info": self.info})


def test_a_window_of_unexploitable_evaluations_stops_the_run() -> None:
    rule = StopRule(tictactoe("stop.exploitability=0", "stop.eval_window=2"))
    assert "exploitability at most 0" in rule.describe()
    evaluator = Evaluator(rule)
    for found in (0.5, 0.0, 1.0, 0.0):
        evaluator.evaluate(0.9, found)
        assert not evaluator.confirm()
    evaluator.evaluate(0.8, 0.0)
    assert evaluator.confirm()
    assert rule.confirmed_by == "evaluator-0" and rule.confirmed_version == 7
    assert rule.confirming_return == 0.85 and rule.target_time == 5.0


def test_a_forged_unexploitable_evaluation_does_not_stop_the_run() -> None:
    rule = StopRule(tictactoe("stop.exploitability=0", "stop.eval_window=1"))
    evaluator = Evaluator(rule)
    evaluator.evaluate(0.9, 0.5)
    # A forged eval at exploitability 0 with the mean the evaluator reported: its heartbeat
    # says that evaluation was exploitable.
    rule.on_eval(
        {"mean": 0.9, "confirming": False, "exploitability": 0.0, "time": 2.0, "env_steps": 1},
        "evaluator-0",
    )
    assert rule.candidates and not evaluator.confirm()
    # An older evaluator's heartbeat, without the exploitability list, confirms nothing.
    del evaluator.info["recent_exploitability"]
    assert not evaluator.confirm()


def test_the_fresh_rule_waits_for_a_confirming_evaluation() -> None:
    rule = StopRule(tictactoe("stop.exploitability=0", "stop.confirm=fresh"))
    assert "fresh episodes" in rule.describe() and "exploitability 0" in rule.describe()
    evaluator = Evaluator(rule)
    evaluator.evaluate(0.9, 0.0)
    assert not evaluator.confirm()  # no confirming evaluation yet
    evaluator.evaluate(0.9, 0.5, confirming=True)
    assert not evaluator.confirm()
    evaluator.evaluate(0.9, 0.0, confirming=True)
    assert evaluator.confirm()


def test_with_a_return_target_too_both_must_hold() -> None:
    rule = StopRule(
        tictactoe("stop.exploitability=0", "stop.eval_return=0.9", "stop.eval_window=1")
    )
    evaluator = Evaluator(rule)
    evaluator.evaluate(0.95, 0.5)  # the return, not the exploitability
    evaluator.evaluate(0.85, 0.0)  # the exploitability, not the return
    assert not evaluator.confirm()
    evaluator.evaluate(0.95, 0.0)
    assert evaluator.confirm()


def test_a_return_target_alone_works_as_before() -> None:
    rule = StopRule(tictactoe("stop.eval_return=0.9", "stop.eval_window=2"))
    evaluator = Evaluator(rule)
    evaluator.evaluate(0.95, None)
    evaluator.evaluate(0.9, None)
    del evaluator.info["recent_exploitability"]  # an evaluator that computes none
    assert evaluator.confirm() and rule.confirming_return == 0.93


@pytest.mark.parametrize(
    "overrides",
    [
        ["env.id=pettingzoo/connect_four_v3"],
        ["evaluator.exploitability=false"],
    ],
)
def test_an_exploitability_target_without_an_exploitability_is_refused(
    overrides: list[str],
) -> None:
    cfg = tictactoe("stop.exploitability=0", *overrides)
    with pytest.raises(ConfigError, match="stop.exploitability"):
        StopRule(cfg)


def test_exploitability_asked_of_a_game_too_big_is_refused() -> None:
    cfg = tictactoe("env.id=pettingzoo/connect_four_v3", "evaluator.exploitability=true")
    with pytest.raises(ConfigError, match="connect_four_v3 is no board game small enough"):
        StopRule(cfg)
    StopRule(tictactoe("env.id=pettingzoo/connect_four_v3"))  # auto: none, and no error


def test_the_limits_stop_at_env_steps_updates_or_wall_time_whichever_comes_first() -> None:
    cfg = load_config(
        REPO / "configs" / "cartpole_apex_dqn.yaml",
        ["stop.env_steps=1000", "stop.updates=50", "stop.wall_time=60"],
    )
    rule = StopRule(cfg)
    row = {"env_steps": 999, "updates": 49, "time": 59.0}
    assert rule.limit_reached(row) is None
    assert rule.limit_reached({**row, "updates": 50}) == "updates"
    assert rule.limit_reached({**row, "env_steps": 1000}) == "env_steps"
    assert rule.limit_reached({**row, "time": 60.0}) == "wall_time"
    unbounded = StopRule(load_config(REPO / "configs" / "cartpole_apex_dqn.yaml", []))
    assert unbounded.limit_reached({**row, "updates": 10**9}) is None


def connect_four(*overrides: str) -> ExperimentConfig:
    """The shipped AlphaZero config, whose stop rule is the issue's: the search player loses
    at most 10 % of its games to alpha-beta at depth 4 from each seat."""
    return load_config(REPO / "configs" / "connect_four_alphazero.yaml", list(overrides))


LOSSES = ("search_alphabeta4_first_loss_rate", "search_alphabeta4_second_loss_rate")


def test_column_bounds_stop_the_run_only_when_each_seat_meets_them() -> None:
    rule = StopRule(connect_four())
    assert all(f"{name} <= 0.1" in rule.describe() for name in LOSSES)
    assert "fresh episodes" in rule.describe()
    evaluator = Evaluator(rule)
    first_ok = {LOSSES[0]: 0.0, LOSSES[1]: 0.3}
    evaluator.evaluate(0.9, None, columns=first_ok)
    evaluator.evaluate(0.9, None, confirming=True, columns=first_ok)
    assert not evaluator.confirm()  # the second seat loses too often
    both_ok = {LOSSES[0]: 0.1, LOSSES[1]: 0.05}
    evaluator.evaluate(0.9, None, columns=both_ok)
    evaluator.evaluate(0.2, None, confirming=True, columns=both_ok)
    assert evaluator.confirm() and rule.confirming_return == 0.2  # no return target
    assert rule.reason() == "eval_bounds"
    assert StopRule(tictactoe("stop.exploitability=0")).reason() == "exploitability"
    assert StopRule(tictactoe("stop.eval_return=0.9")).reason() == "eval_return"


def test_a_forged_evaluation_meeting_the_bounds_does_not_stop_the_run() -> None:
    rule = StopRule(connect_four("stop.confirm=window", "stop.eval_window=1"))
    evaluator = Evaluator(rule)
    evaluator.evaluate(0.9, None, columns={LOSSES[0]: 0.5, LOSSES[1]: 0.5})
    forged = {"mean": 0.9, "confirming": False, "time": 2.0, "env_steps": 1}
    rule.on_eval({**forged, LOSSES[0]: 0.0, LOSSES[1]: 0.0}, "evaluator-0")
    assert rule.candidates and not evaluator.confirm()  # its heartbeat: not met
    evaluator.info["recent_bounds_met"] = []  # a heartbeat without the list confirms nothing
    evaluator.evaluate(0.9, None, columns={LOSSES[0]: 0.0, LOSSES[1]: 0.0})
    evaluator.info["recent_bounds_met"] = evaluator.info["recent_bounds_met"][-1:]
    assert not evaluator.confirm()


def test_a_bound_on_a_column_no_evaluation_writes_is_refused_with_the_columns() -> None:
    with pytest.raises(ConfigError, match="did you mean search_alphabeta4_first_loss_rate") as e:
        StopRule(connect_four("stop.eval_at_most={search_alphabeta4_first_loss: 0.1}"))
    assert "alphabeta2_second_win_rate" in str(e.value)
    with pytest.raises(ConfigError, match="'exploitability' is no column"):
        StopRule(connect_four("stop.eval_at_least={exploitability: 0.0}"))
