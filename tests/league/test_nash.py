"""The league on DI-engine's 2x2 zero-sum demo game reaches the game's mixed Nash equilibrium.

The game (``dizoo/league_demo/game_env.py``, ``game_type="zero_sum"``): each player picks
0 or 1; the row player's reward is

    A = [[ 3, -2],
         [-2,  1]]

and the column player's is -A. The row player wins when the actions match, the column
player when they differ. Either player's equilibrium makes the other indifferent:
3q - 2(1 - q) = -2q + (1 - q) gives q = 3/8, and as A is symmetric the row player's p is
3/8 as well: both play [0.375, 0.625] (the game's value is -1/8 to the row player).

A strategy here is a pair of distributions, one per role (DI-engine's observation tells each
player its side); main plays both roles against every opponent the league picks. Main
learns by smooth fictitious play: it keeps an exponential average of each role's payoff
vector against the strategies of the opponents ``League.choose_opponent`` gives it ("main"
is its current self, a snapshot the strategy stored under the id ``add_snapshot`` returned,
"random" the uniform strategy) and plays the softmax of beta times that average. Game
results sampled from the strategies go to ``League.record``; main is snapshot whenever
``League.snapshot_reason`` says so, under the default config and a fake clock that moves
6 s per iteration (a snapshot every 20 iterations unless the win-rate rule fires first).

The check: the mean of the strategies of the snapshots in the league (the last 50 by
default), each role, is within 0.05 (max abs) of [0.375, 0.625]. In trials over seeds 0-9
the error was at most 0.035 (2000 iterations; 0.03 at 3000); 0.014 of it is the softmax's own
pull (the logit equilibrium at beta = 5 has P(action 0) = 0.389 for the row, 0.364 for the
column, where this learner alone in pure self-play settles).

The snapshot cadence matters: 50 snapshots 20 iterations apart span about eight times main's
averaging time (1 / (4 * 0.002) iterations), so PFSP over them acts like fictitious play's
average. With a snapshot every 1-4 iterations the pool is only main's recent past, and
chasing the snapshots that beat it (PFSP "squared") drives main round the game's cycle with
growing amplitude instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from zrl.config.league import MAIN, LeagueConfig
from zrl.league.population import League
from zrl.testing.fakes import FakeClock

A = np.array([[3.0, -2.0], [-2.0, 1.0]])
NASH = np.array([0.375, 0.625])
TOLERANCE = 0.05
ROW, COL = 0, 1


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def payoffs(opponent: np.ndarray) -> np.ndarray:
    """Expected reward of each action in each role against ``opponent`` (its other role)."""
    return np.stack([A @ opponent[COL], -(A.T @ opponent[ROW])])


def outcome(rng: np.random.Generator, row: np.ndarray, col: np.ndarray) -> int:
    """One sampled game: +1 when the row player wins (the actions match), -1 otherwise."""
    return 1 if (rng.random() < row[0]) == (rng.random() < col[0]) else -1


def train(
    seed: int, iterations: int = 2000, games: int = 4, beta: float = 5.0, step: float = 0.002
) -> tuple[League, dict[str, np.ndarray]]:
    """Main learns against the league's picks; returns the league and every snapshot's
    strategy by id."""
    clock = FakeClock()
    league = League(LeagueConfig(), seed=seed, clock=clock)
    rng = np.random.default_rng(seed + 1)
    average = rng.normal(size=(2, 2))  # a random start, away from the equilibrium
    strategies = {"random": np.full((2, 2), 0.5)}
    for version in range(1, iterations + 1):
        main = softmax(beta * average)
        for _ in range(games):
            name = league.choose_opponent()
            opponent = main if name == MAIN else strategies[name]
            league.record(name, outcome(rng, main[ROW], opponent[COL]))
            league.record(name, -outcome(rng, opponent[ROW], main[COL]))
            average += step * (payoffs(opponent) - average)
        clock.t += 6.0
        if league.snapshot_reason():
            strategies[league.add_snapshot(version)] = softmax(beta * average)
    return league, strategies


@pytest.mark.parametrize("seed", [0, 1])
def test_population_reaches_the_mixed_equilibrium(seed: int) -> None:
    league, strategies = train(seed)
    assert len(league.snapshots) == league.cfg.max_snapshots
    assert league.self_play_games > 0 and league.payoff.games(MAIN, "random") > 0
    population = np.mean([strategies[name] for name in league.snapshots], axis=0)
    error = np.abs(population - NASH).max()
    assert error <= TOLERANCE, (population, error)
