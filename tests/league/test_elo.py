"""Elo ratings against numbers worked out by hand."""

from __future__ import annotations

import json

import pytest

from zrl.league.elo import Elo


@pytest.mark.parametrize(("outcome", "a", "b"), [(1, 1008, 992), (0, 1000, 1000), (-1, 992, 1008)])
def test_equal_ratings(outcome: int, a: float, b: float) -> None:
    elo = Elo(k=16, initial=1000)
    elo.record("a", "b", outcome)
    assert elo.rating("a") == pytest.approx(a)
    assert elo.rating("b") == pytest.approx(b)


def test_favourite_gains_little_and_loses_much() -> None:
    elo = Elo(k=16, initial=1000)
    elo.set_rating("a", 1400)
    # expected score of a: 1 / (1 + 10^(-400/400)) = 10/11
    assert elo.expected("a", "b") == pytest.approx(10 / 11)
    elo.record("a", "b", 1)
    assert elo.rating("a") == pytest.approx(1400 + 16 / 11)
    assert elo.rating("b") == pytest.approx(1000 - 16 / 11)
    elo.set_rating("a", 1400)
    elo.set_rating("b", 1000)
    elo.record("a", "b", -1)
    assert elo.rating("a") == pytest.approx(1400 - 160 / 11)  # 1385.45...
    assert elo.rating("b") == pytest.approx(1000 + 160 / 11)


def test_unknown_is_initial_and_forget_resets() -> None:
    elo = Elo(k=32, initial=1500)
    assert elo.rating("x") == 1500
    elo.record("x", "y", 1)
    assert elo.ratings() == {"x": 1516, "y": 1484}
    elo.forget("x")
    assert elo.ratings() == {"y": 1484}
    assert elo.rating("x") == 1500


def test_refuses_self_games_and_bad_outcomes() -> None:
    elo = Elo()
    with pytest.raises(ValueError):
        elo.record("a", "a", 1)
    with pytest.raises(ValueError, match="outcome"):
        elo.record("a", "b", 3)


def test_state_round_trip_is_exact() -> None:
    elo = Elo(k=16)
    for i, outcome in enumerate([1, -1, 0, 1, 1, -1]):
        elo.record("main", f"main@{i % 3}", outcome)
    state = json.loads(json.dumps(elo.state_dict()))
    restored = Elo(k=16)
    restored.load_state_dict(state)
    assert restored.ratings() == elo.ratings()
    assert restored.state_dict() == elo.state_dict()
