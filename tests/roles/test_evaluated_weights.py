"""The weights an evaluator keeps for the head's ``model.pt`` and ``model_best.pt``: the stop
rule as both sides count it, the best and ``met`` files, their bounds and their reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zrl.config.sections import StopConfig
from zrl.roles.evaluated_weights import (
    BEST_SUFFIX,
    FILE_SLACK_BYTES,
    KEEP_MET,
    Evaluated,
    EvaluatedKeeper,
    met_suffix,
    read_evaluated,
    rule_met,
    same_layout,
    write_evaluated,
)


class Exploit:
    """Unpickling this creates ``marker``: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def fake_weights(version: int) -> dict[str, np.ndarray]:
    """Weights that say which version they are."""
    return {"w": np.full((2, 3), float(version), np.float32), "b": np.arange(3, dtype=np.int64)}


def keeper_in(folder: Path, **stop: object) -> EvaluatedKeeper:
    return EvaluatedKeeper(
        lambda suffix: folder / f"evaluator-0{suffix}",
        StopConfig.model_validate({"eval_return": 100, **stop}),
        max_bytes=1 << 20,
    )


def test_the_rule_is_a_window_mean_or_a_confirming_evaluation():
    window = StopConfig.model_validate({"eval_return": 100, "eval_window": 3})
    assert rule_met(window, [200, 200], False) == []  # not a whole window yet
    assert rule_met(window, [0, 150, 100, 50], False) == [150, 100, 50]  # at it: met
    assert rule_met(window, [0, 150, 100, 60], False) == [150, 100, 60]  # mean 103.3
    assert rule_met(window, [0, 150, 100, 49], False) == []  # mean 99.7
    fresh = StopConfig.model_validate({"eval_return": 100, "confirm": "fresh"})
    assert rule_met(fresh, [500], False) == []  # a regular evaluation only asks for one
    assert rule_met(fresh, [500, 99], True) == []
    assert rule_met(fresh, [0, 100], True) == [100]
    assert rule_met(StopConfig.model_validate({"eval_return": None}), [500], True) == []


def test_the_exploitability_target_holds_for_every_evaluation_of_the_rule():
    window = StopConfig.model_validate(
        {"eval_return": None, "exploitability": 0.0, "eval_window": 2}
    )
    means = [0.9, 0.8, 0.95]
    assert rule_met(window, means, False, [0.0, 0.5, 0.0]) == []  # one window member at 0.5
    assert rule_met(window, means, False, [0.5, 0.0, 0.0]) == [0.8, 0.95]
    assert rule_met(window, means, False, [0.0, None]) == []  # the latest was not searched
    assert rule_met(window, means, False) == []  # none was
    fresh = StopConfig.model_validate(
        {"eval_return": None, "exploitability": 0.5, "confirm": "fresh"}
    )
    assert rule_met(fresh, [0.2], False, [0.0]) == []  # not a confirming evaluation
    assert rule_met(fresh, [0.2], True, [0.5]) == [0.2]
    assert rule_met(fresh, [0.2], True, [1.0]) == []
    # Both targets: the return and the exploitability.
    both = StopConfig.model_validate({"eval_return": 0.9, "exploitability": 0.0, "eval_window": 1})
    assert rule_met(both, [0.95], False, [0.5]) == []
    assert rule_met(both, [0.85], False, [0.0]) == []
    assert rule_met(both, [0.95], False, [0.0]) == [0.95]


def test_column_bounds_hold_for_every_evaluation_of_the_rule():
    stop = StopConfig.model_validate(
        {
            "eval_return": None,
            "eval_at_least": {"search_alphabeta4_first_draw_rate": 0.5},
            "eval_at_most": {"search_alphabeta4_second_loss_rate": 0.1},
            "eval_window": 2,
        }
    )
    assert stop.on_evaluations and stop.has_bounds
    good = {"search_alphabeta4_first_draw_rate": 0.5, "search_alphabeta4_second_loss_rate": 0.1}
    assert stop.bounds_met(good)
    assert not stop.bounds_met({**good, "search_alphabeta4_first_draw_rate": 0.4})
    assert not stop.bounds_met({**good, "search_alphabeta4_second_loss_rate": 0.2})
    assert not stop.bounds_met({"search_alphabeta4_first_draw_rate": 0.9})  # a column missing
    assert not stop.bounds_met({**good, "search_alphabeta4_second_loss_rate": float("nan")})
    assert not stop.bounds_met({**good, "search_alphabeta4_second_loss_rate": "0.0"})
    assert rule_met(stop, [0.0, 0.0], False, [], [True, False]) == []
    assert rule_met(stop, [0.0, 0.0, 0.0], False, [], [False, True, True]) == [0.0, 0.0]
    assert rule_met(stop, [0.0, 0.0], False, [], [True]) == []  # one not reported
    assert rule_met(stop, [0.0, 0.0], False) == []
    no_bounds = StopConfig.model_validate({"eval_return": 0.0, "eval_window": 1})
    assert not no_bounds.has_bounds and no_bounds.bounds_met({})
    assert rule_met(no_bounds, [0.0], False) == [0.0]


def test_the_weights_that_met_an_exploitability_target_are_kept(tmp_path: Path):
    keeper = keeper_in(tmp_path, eval_return=None, exploitability=0.0, eval_window=1)
    assert keeper.on_eval(2, 0.9, 10, False, lambda: fake_weights(2), 0.5) == [
        tmp_path / f"evaluator-0{BEST_SUFFIX}"
    ]
    written = keeper.on_eval(3, 0.8, 10, False, lambda: fake_weights(3), 0.0)
    assert written == [tmp_path / f"evaluator-0{met_suffix(3)}"]


def test_the_initial_weights_are_never_the_best(tmp_path: Path):
    """Issue 40, item 8: a run without a target saved v1, the untrained policy, as model.pt
    because its first evaluation was the highest of many noisy ones."""
    keeper = keeper_in(tmp_path, eval_return=None, wall_time=60)
    assert keeper.on_eval(1, -0.4, 10, False, lambda: fake_weights(1)) == []
    assert keeper.best_return is None
    assert keeper.on_eval(2, -131.0, 10, False, lambda: fake_weights(2)) == [
        tmp_path / f"evaluator-0{BEST_SUFFIX}"
    ]
    assert read_evaluated(tmp_path / f"evaluator-0{BEST_SUFFIX}", 1 << 20).version == 2


def test_the_best_evaluation_and_those_that_met_the_rule_are_kept(tmp_path: Path):
    keeper = keeper_in(tmp_path, eval_window=2)
    asked: list[int] = []

    def evaluate(version: int, mean: float) -> list[str]:
        def weights() -> dict[str, np.ndarray]:
            asked.append(version)
            return fake_weights(version)

        return [p.name for p in keeper.on_eval(version, mean, 10, False, weights)]

    assert evaluate(1, 40.0) == []  # the initial weights: never the best
    assert evaluate(2, 20.0) == ["evaluator-0.best.pt"]
    assert evaluate(2, 10.0) == []  # worse, and the window's mean is 15
    assert evaluate(3, 250.0) == ["evaluator-0.best.pt", "evaluator-0.met-3.pt"]  # mean 130
    assert evaluate(4, 30.0) == ["evaluator-0.met-4.pt"]  # mean 140: met, not the best
    assert evaluate(5, 20.0) == []  # mean 25
    assert asked == [2, 3, 4]  # the weights are copied only for a file
    best = read_evaluated(tmp_path / f"evaluator-0{BEST_SUFFIX}", 1 << 20)
    assert (best.version, best.eval_return, best.episodes, best.confirming) == (3, 250.0, 10, False)
    np.testing.assert_array_equal(best.weights["w"], fake_weights(3)["w"])
    met = read_evaluated(tmp_path / f"evaluator-0{met_suffix(4)}", 1 << 20)
    assert met.version == 4 and met.eval_return == 30.0
    assert same_layout(met.weights, fake_weights(9)) is None

    # A restarted evaluator keeps its best (a worse evaluation leaves the file alone), and
    # counts the met files already there in its bound.
    again = keeper_in(tmp_path, eval_window=1)
    assert again.best_return == 250.0 and len(again.met_files) == 2
    assert again.on_eval(6, 200.0, 10, False, lambda: fake_weights(6)) == [
        tmp_path / f"evaluator-0{met_suffix(6)}"
    ]
    for v in range(7, 7 + KEEP_MET):
        again.on_eval(v, 150.0, 10, False, lambda v=v: fake_weights(v))
    kept = sorted(tmp_path.glob("evaluator-0.met-*.pt"))
    assert len(kept) == KEEP_MET
    assert {p.name for p in kept} == {f"evaluator-0{met_suffix(v)}" for v in range(7, 15)}
    assert read_evaluated(tmp_path / f"evaluator-0{BEST_SUFFIX}", 1 << 20).version == 3


def test_a_confirming_evaluation_keeps_the_confirmed_weights(tmp_path: Path):
    keeper = keeper_in(tmp_path, confirm="fresh")
    assert [p.name for p in keeper.on_eval(2, 120.0, 10, False, lambda: fake_weights(2))] == [
        "evaluator-0.best.pt"
    ]
    got = keeper.on_eval(2, 110.0, 100, True, lambda: fake_weights(2))
    assert [p.name for p in got] == ["evaluator-0.met-2.pt"]
    met = read_evaluated(got[0], 1 << 20)
    assert (met.version, met.eval_return, met.episodes, met.confirming) == (2, 110.0, 100, True)


def test_without_a_checkpoint_dir_nothing_is_kept():
    keeper = EvaluatedKeeper(lambda suffix: None, StopConfig(eval_return=1), 1 << 20)
    assert keeper.on_eval(1, 500.0, 10, False, lambda: pytest.fail("weights asked")) == []


def test_reading_refuses_big_foreign_and_pickled_files(tmp_path: Path):
    path = tmp_path / "evaluator-0.best.pt"
    with pytest.raises(ValueError, match="cannot be read"):
        read_evaluated(path, 1 << 20)
    write_evaluated(path, Evaluated(7, {"w": np.zeros(1000, np.float32)}, 1.5))
    assert read_evaluated(path, 4000).version == 7
    with pytest.raises(ValueError, match="more than weights may"):
        read_evaluated(path, path.stat().st_size - FILE_SLACK_BYTES - 1)
    torch.save({"weights": {"w": torch.zeros(3)}}, path)  # no version
    with pytest.raises(ValueError, match="not weights an evaluator kept"):
        read_evaluated(path, 1 << 20)

    marker = tmp_path / "pwned"
    torch.save({"weights": Exploit(marker), "version": 1}, path)
    with pytest.raises(ValueError, match="not weights an evaluator kept"):
        read_evaluated(path, 1 << 20)
    assert not marker.exists()
    assert "shape" in str(same_layout({"w": np.zeros(2)}, {"w": np.zeros(3)}))
    assert "other arrays" in str(same_layout({"w": np.zeros(2)}, {"v": np.zeros(2)}))
