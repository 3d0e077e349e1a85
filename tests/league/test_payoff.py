"""Payoff: decayed counts against a reference written from the definition, mirroring,
win rates with draws, forgetting, state round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zrl.league.payoff import Payoff

INDEX = {1: 0, 0: 1, -1: 2}  # outcome -> [wins, draws, losses]


def reference_counts(
    results: list[tuple[str, str, int]], decay: float
) -> dict[tuple[str, str], list[float]]:
    """By the definition: each result multiplies both orders' counts of its pair by decay,
    then adds one to the player's outcome and one to the opponent's mirrored outcome."""
    counts: dict[tuple[str, str], list[float]] = {}
    for player, opponent, outcome in results:
        for pair in ((player, opponent), (opponent, player)):
            counts[pair] = [c * decay for c in counts.get(pair, [0.0, 0.0, 0.0])]
        counts[(player, opponent)][INDEX[outcome]] += 1
        counts[(opponent, player)][INDEX[-outcome]] += 1
    return counts


def test_decayed_counts_match_the_reference_loop() -> None:
    rng = np.random.default_rng(3)
    names = ["a", "b", "c"]
    results = []
    for _ in range(300):
        player, opponent = rng.choice(names, size=2, replace=False)
        results.append((str(player), str(opponent), int(rng.choice([-1, 0, 1]))))
    payoff = Payoff(decay=0.95)
    for result in results:
        payoff.record(*result)
    reference = reference_counts(results, 0.95)
    assert len(reference) == 6
    for (player, opponent), counts in reference.items():
        assert payoff.counts(player, opponent) == pytest.approx(counts, rel=1e-12)
        assert payoff.games(player, opponent) == pytest.approx(sum(counts), rel=1e-12)


def test_decay_by_hand() -> None:
    payoff = Payoff(decay=0.5)
    for outcome in (1, 1, -1):
        payoff.record("a", "b", outcome)
    # wins (1 * 0.5 + 1) * 0.5 = 0.75, losses 1: win rate 0.75 / 1.75
    assert payoff.counts("a", "b") == (0.75, 0.0, 1.0)
    assert payoff.counts("b", "a") == (1.0, 0.0, 0.75)
    assert payoff.win_rate("a", "b") == pytest.approx(3 / 7)
    assert payoff.win_rate("b", "a") == pytest.approx(4 / 7)


def test_win_rate_counts_draws_as_half() -> None:
    payoff = Payoff(decay=1.0)
    for outcome in (1, 1, 0, -1):
        payoff.record("a", "b", outcome)
    assert payoff.counts("a", "b") == (2.0, 1.0, 1.0)
    assert payoff.counts("b", "a") == (1.0, 1.0, 2.0)
    assert payoff.win_rate("a", "b") == pytest.approx(2.5 / 4)
    assert payoff.win_rate("b", "a") == pytest.approx(1.5 / 4)
    assert payoff.games("a", "b") == payoff.games("b", "a") == 4.0


def test_no_games_is_even() -> None:
    payoff = Payoff()
    assert payoff.win_rate("a", "b") == 0.5
    assert payoff.games("a", "b") == 0.0
    np.testing.assert_array_equal(payoff.win_rates("a", ["b", "c"]), [0.5, 0.5])


def test_refuses_self_games_and_bad_outcomes() -> None:
    payoff = Payoff()
    with pytest.raises(ValueError, match="itself"):
        payoff.record("a", "a", 1)
    for outcome in (2, -2, True):
        with pytest.raises(ValueError, match="outcome"):
            payoff.record("a", "b", outcome)
    with pytest.raises(ValueError):
        Payoff(decay=0.0)


def test_forget_drops_both_orders_only_of_that_member() -> None:
    payoff = Payoff()
    payoff.record("a", "b", 1)
    payoff.record("a", "c", -1)
    payoff.forget("b")
    assert payoff.games("a", "b") == payoff.games("b", "a") == 0.0
    assert payoff.counts("a", "c") == (0.0, 0.0, 1.0)
    assert payoff.counts("c", "a") == (1.0, 0.0, 0.0)


def test_state_round_trip_is_exact() -> None:
    payoff = Payoff(decay=0.9)
    rng = np.random.default_rng(0)
    for _ in range(50):
        payoff.record("main", f"main@{rng.integers(3)}", int(rng.choice([-1, 0, 1])))
    state = json.loads(json.dumps(payoff.state_dict()))
    restored = Payoff(decay=0.9)
    restored.load_state_dict(state)
    assert restored.state_dict() == payoff.state_dict()
    for i in range(3):
        assert restored.counts("main", f"main@{i}") == payoff.counts("main", f"main@{i}")
