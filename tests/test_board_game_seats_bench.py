"""``benchmarks/board_game_seats.py``: one game of a greedy policy against a reference player,
scored from the policy's side, on the rules the search module plays."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch

from tests.helpers.benchmarks import load_benchmark
from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.search import AlphaBetaPlayer, PerfectPlayer
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.discrete import AgentActorCritic


def load_bench() -> ModuleType:
    return load_benchmark("board_game_seats")


def prefers(squares: list[int]) -> AgentActorCritic:
    """A model whose greedy move is the first legal square of ``squares`` (then the rest)."""
    model = AgentActorCritic(AgentObservationSpace((3, 3, 2), mask=9, state=0), 9, hidden=(8,))
    with torch.no_grad():
        model.policy_head.weight.zero_()
        model.policy_head.bias.fill_(-10.0)
        for rank, square in enumerate(squares):
            model.policy_head.bias[square] = 50.0 - rank
    return model


def test_a_policy_that_fills_the_top_row_first_wins_or_loses_as_the_rules_say():
    bench = load_bench()
    game, rng = GAMES["tictactoe"], np.random.default_rng(0)
    top_row = prefers([0, 1, 2, 3, 4, 5, 6, 7, 8])
    # Moving first against a perfect player it never wins, and it loses: the perfect player
    # blocks the row and completes its own line while the policy keeps to its order.
    results = {bench.play(game, top_row, PerfectPlayer(game), True, rng) for _ in range(10)}
    assert results <= {0, -1} and -1 in results
    # Against random moves, moving first, it completes the top row whenever random leaves it.
    results = [bench.play(game, top_row, None, True, rng) for _ in range(200)]
    assert 0.3 < np.mean(np.array(results) > 0) < 1.0


def test_the_reference_players_follow_the_board_size():
    bench = load_bench()
    assert set(bench.reference_players(GAMES["tictactoe"])) == {"random", "perfect"}
    players = bench.reference_players(GAMES["connect_four"])
    assert set(players) == {"random", "alphabeta2", "alphabeta4"}
    assert isinstance(players["alphabeta4"], AlphaBetaPlayer) and players["alphabeta4"].depth == 4
