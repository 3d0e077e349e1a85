"""``FixedOpponents``: the random player picks only legal moves, uniformly among them (and any
action without a mask); the scripted player plays the game's script; finished episodes are
counted per opponent and ``rates`` gives their win/draw/loss shares; a name no player answers
to raises ``UnknownOpponentError`` naming it."""

from __future__ import annotations

import numpy as np
import pytest

from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.opponents import FixedOpponents, UnknownOpponentError
from zrl.envs.multiagent.spaces import AgentObservationSpace

BOARD = AgentObservationSpace((3, 3, 2), mask=9, state=0)


def slot_obs(own: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.concatenate([own.reshape(len(own), -1), mask], axis=1).astype(np.float32)


def test_random_picks_only_legal_moves():
    rng = np.random.default_rng(0)
    masks = rng.random((500, 9)) < 0.3
    masks[np.arange(500), rng.integers(0, 9, 500)] = True  # at least one legal move each
    obs = slot_obs(np.zeros((500, 3, 3, 2)), masks)
    player = FixedOpponents("random", BOARD, 9, GAMES["tictactoe"], seed=1)
    for _ in range(5):
        actions = player.act("random", obs)
        assert actions.shape == (500,)
        assert masks[np.arange(500), actions].all()


def test_random_is_uniform_over_the_legal_moves():
    mask = np.zeros((4000, 9), bool)
    mask[:, [1, 4, 7]] = True
    player = FixedOpponents("random", BOARD, 9, None, seed=2)
    actions = player.act("random", slot_obs(np.zeros((4000, 3, 3, 2)), mask))
    shares = np.bincount(actions, minlength=9) / len(actions)
    np.testing.assert_allclose(shares[[1, 4, 7]], 1 / 3, atol=0.04)
    assert shares[[0, 2, 3, 5, 6, 8]].sum() == 0.0


def test_random_without_a_mask_uses_every_action():
    space = AgentObservationSpace((18,), mask=0, state=54)
    player = FixedOpponents("random", space, 5, None, seed=0)
    actions = player.act("random", np.zeros((2000, 72), np.float32))
    shares = np.bincount(actions, minlength=5) / len(actions)
    assert len(shares) == 5
    np.testing.assert_allclose(shares, 0.2, atol=0.04)


def test_scripted_plays_the_games_script():
    own = np.zeros((2, 3, 3, 2))
    own[1, 0, 0, 0] = own[1, 0, 1, 0] = 1  # x x . : the winning square is 2
    own[1, 1, 0, 1] = own[1, 1, 1, 1] = 1  # o o .
    mask = ~own.any(axis=-1).reshape(2, 9)
    player = FixedOpponents("scripted", BOARD, 9, GAMES["tictactoe"], seed=0)
    assert player.act("scripted", slot_obs(own, mask)).tolist() == [4, 2]


def test_choose_finished_and_rates():
    player = FixedOpponents("scripted", BOARD, 9, GAMES["tictactoe"], seed=0)
    assert player.choose() == "scripted"
    for outcome in (1, 1, 0, -1):
        player.finished("scripted", outcome)
    player.finished("random", -1)
    assert player.rates("scripted") == {"win_rate": 0.5, "draw_rate": 0.25, "loss_rate": 0.25}
    assert player.rates("random") == {"win_rate": 0.0, "draw_rate": 0.0, "loss_rate": 1.0}
    assert player.rates("nobody") == {"win_rate": 0.0, "draw_rate": 0.0, "loss_rate": 0.0}
    np.testing.assert_array_equal(player.results["scripted"], [2, 1, 1])


def test_unknown_names_are_refused():
    player = FixedOpponents("random", BOARD, 9, GAMES["tictactoe"], seed=0)
    obs = slot_obs(np.zeros((1, 3, 3, 2)), np.ones((1, 9), bool))
    with pytest.raises(UnknownOpponentError, match="'main@3'"):
        player.act("main@3", obs)
    no_script = FixedOpponents("scripted", AgentObservationSpace((18,), 0, 0), 5, None, seed=0)
    with pytest.raises(UnknownOpponentError, match="no scripted player"):
        no_script.act("scripted", np.zeros((1, 18), np.float32))


def test_a_search_player_calls_back_after_each_move():
    space = AgentObservationSpace((6, 7, 2), mask=7, state=0)
    players = FixedOpponents("alphabeta2", space, 7, GAMES["connect_four"], seed=0)
    calls: list[int] = []
    players.between_searches = lambda: calls.append(1)
    obs = np.zeros((3, space.shape[0]), np.float32)
    obs[:, space.features :] = 1.0  # empty boards: every column legal
    actions = players.act("alphabeta2", obs)
    assert actions.shape == (3,) and len(calls) == 3
    players.act("random", obs)  # no search, no call
    assert len(calls) == 3
