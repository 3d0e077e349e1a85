"""The exploitability an evaluation reports (``zrl.roles.evaluation``): which envs get one
(``evaluator.exploitability``), and a model's greedy policy searched through the same path the
evaluator takes (``greedy_actions`` on the slot observation), for a model with a planted hole
and for the real tic-tac-toe model of ``configs/tictactoe_league.yaml``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from zrl.algos.models import experiment_model
from zrl.config.experiment import load_config
from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.search import PerfectPlayer, exploitability, from_planes
from zrl.envs.vector import make_vector_env
from zrl.roles.evaluation import (
    exploitability_fields,
    exploitability_game,
    greedy_exploitability,
)

REPO = Path(__file__).resolve().parents[2]
TICTACTOE = GAMES["tictactoe"]


def test_exploitability_is_on_where_the_game_is_small_enough() -> None:
    assert exploitability_game("auto", "pettingzoo/tictactoe_v3") is TICTACTOE
    assert exploitability_game(True, "pettingzoo/tictactoe_v3") is TICTACTOE
    assert exploitability_game(False, "pettingzoo/tictactoe_v3") is None
    for env_id in ("pettingzoo/connect_four_v3", "CartPole-v1", "mpe2/simple_spread_v3"):
        assert exploitability_game("auto", env_id) is None
        with pytest.raises(ValueError, match=env_id):
            exploitability_game(True, env_id)


class PlantedModel(nn.Module):
    """An actor-critic whose logits pick the perfect player's first best move, except in
    the positions of ``hole`` ({(mine, theirs): action})."""

    def __init__(self, hole: dict[tuple[int, int], int]) -> None:
        super().__init__()
        self.perfect = PerfectPlayer(TICTACTOE, tie_break="first")
        self.hole = hole
        self.asked = 0

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.asked += len(obs)
        logits = torch.zeros(len(obs), TICTACTOE.num_actions)
        for i, row in enumerate(obs.numpy()):
            position = from_planes(row[:18].reshape(3, 3, 2))
            action = self.hole.get(position, self.perfect.best_actions(*position)[0])
            logits[i, action] = 1.0
        return logits, torch.zeros(len(obs))


def test_a_planted_hole_is_found_through_the_models_greedy_policy() -> None:
    sound = greedy_exploitability(PlantedModel({}), TICTACTOE)
    assert exploitability_fields(sound) == {
        "exploitability": 0.0,
        "exploitability_first": 0,
        "exploitability_second": 0,
        "losing_lines": 0,
    }
    # Answering the corner (square 0) with the edge square 1 loses as the second mover
    # (counted by hand in tests/envs/multiagent/test_search.py).
    model = PlantedModel({(0, 1): 1})
    holed = exploitability_fields(greedy_exploitability(model, TICTACTOE))
    assert holed["exploitability"] == 0.5
    assert holed["exploitability_first"] == 0 and holed["exploitability_second"] == -1
    assert holed["losing_lines"] >= 1
    assert model.asked > 0


def test_the_real_models_greedy_policy_is_searched_with_its_action_mask() -> None:
    cfg = load_config(REPO / "configs" / "tictactoe_league.yaml")
    probe = make_vector_env(cfg.env, 1, None)
    try:
        torch.manual_seed(0)
        model = experiment_model(cfg, probe.single_observation_space, probe.single_action_space)
    finally:
        probe.close()
    model.eval()
    found = greedy_exploitability(model, TICTACTOE)

    # The same search over the model's raw logits with the legal moves masked by hand: the
    # model never plays an occupied square (which would lose at once).
    def masked(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.from_numpy(obs))[0].numpy()
        return np.where(obs[:, 18:] > 0.5, logits, -np.inf).argmax(axis=1)

    assert found == exploitability(TICTACTOE, masked)
    assert found.value in (0.0, 0.5, 1.0) and found.positions > 9


def test_a_recurrent_model_has_no_exploitability() -> None:
    class Recurrent(nn.Module):
        """State (``initial_state``, ``step``, ``unroll``): moves depend on the history."""

        def initial_state(self, batch: int) -> torch.Tensor:
            return torch.zeros(batch, 1)

        def step(self, obs: torch.Tensor, state: torch.Tensor) -> None:
            raise AssertionError("never asked")

        unroll = step

    with pytest.raises(ValueError, match="recurrent"):
        greedy_exploitability(Recurrent(), TICTACTOE)
