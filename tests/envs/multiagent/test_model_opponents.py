"""``ModelOpponents``: ``self`` samples from the actor's own model (masked logits), a league
snapshot is built from the matchmaker's weights on first use and then cached (least recently
used dropped past ``CACHED_MODELS``), random and scripted go to the fixed players, and a
finished episode is counted by the fixed players and reported to the matchmaker."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.opponents import FixedOpponents, UnknownOpponentError
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.discrete import AgentActorCritic
from zrl.nets.wire import model_to_arrays
from zrl.roles import model_opponents
from zrl.roles.model_opponents import ModelOpponents

torch.set_num_threads(1)

BOARD = AgentObservationSpace((3, 3, 2), mask=9, state=0)


def build() -> AgentActorCritic:
    return AgentActorCritic(BOARD, 9, hidden=(8,))


def forcing(action: int) -> AgentActorCritic:
    """A model that plays ``action`` whenever it is legal."""
    model = build()
    with torch.no_grad():
        model.policy_head.weight.zero_()
        model.policy_head.bias.zero_()
        model.policy_head.bias[action] = 50.0
    return model


def boards(n: int, legal: list[int]) -> np.ndarray:
    obs = np.zeros((n, BOARD.shape[0]), np.float32)
    obs[:, [BOARD.features + a for a in legal]] = 1.0
    return obs


class FakeMatchmaker:
    def __init__(self, weights: dict[str, dict[str, np.ndarray]]) -> None:
        self.snapshots = weights
        self.asked: list[str] = []
        self.results: list[tuple[str, int]] = []
        self.next = "main@1"

    def choose(self) -> str:
        return self.next

    def finished(self, name: str, outcome: int) -> None:
        self.results.append((name, outcome))

    def weights(self, name: str):
        self.asked.append(name)
        return self.snapshots.get(name)


def opponents(matchmaker=None, model=None, opponent="self") -> ModelOpponents:
    fixed = FixedOpponents(opponent, BOARD, 9, GAMES["tictactoe"], seed=0)
    return ModelOpponents(fixed, model if model is not None else forcing(2), build, matchmaker)


def test_self_plays_the_given_model_within_the_mask():
    players = opponents(model=forcing(2))
    assert players.choose() == "self"
    assert (players.act("self", boards(50, [0, 2, 5])) == 2).all()
    # 2 illegal: the forced logit is masked away and the move is one of the legal ones
    actions = players.act("self", boards(200, [0, 5, 8]))
    assert set(actions.tolist()) <= {0, 5, 8}
    assert len(set(actions.tolist())) == 3  # sampled, not a fixed line


def test_snapshots_come_from_the_matchmaker_and_are_cached():
    matchmaker = FakeMatchmaker({"main@1": model_to_arrays(forcing(6))})
    players = opponents(matchmaker, model=forcing(2))
    assert players.choose() == "main@1"
    assert (players.act("main@1", boards(20, [2, 6])) == 6).all()
    assert (players.act("main@1", boards(20, [2, 6, 7])) == 6).all()
    assert matchmaker.asked == ["main@1"]  # fetched and built once
    assert (players.act("self", boards(20, [2, 6])) == 2).all()  # the current model unchanged
    with pytest.raises(KeyError, match="main@9"):
        players.act("main@9", boards(1, [0]))
    with pytest.raises(KeyError, match="main@1"):
        opponents(None).act("main@1", boards(1, [0]))


def test_the_least_recently_used_snapshot_is_dropped(monkeypatch):
    monkeypatch.setattr(model_opponents, "CACHED_MODELS", 2)
    weights = {f"main@{v}": model_to_arrays(forcing(v)) for v in range(4)}
    matchmaker = FakeMatchmaker(weights)
    players = opponents(matchmaker)
    built = []
    players.build = lambda: built.append(1) or build()
    for name in ("main@0", "main@1", "main@0", "main@2"):
        players.act(name, boards(1, [0, 1, 2, 3]))
    assert list(players.models) == ["main@0", "main@2"]
    # main@1's network was reloaded with main@2's weights, not built again, and plays them.
    assert len(built) == 2
    assert (players.act("main@2", boards(20, [0, 1, 2, 3])) == 2).all()
    assert (players.act("main@1", boards(20, [0, 1, 2, 3])) == 1).all()
    assert matchmaker.asked == ["main@0", "main@1", "main@2", "main@1"]
    assert len(built) == 2


def test_fixed_players_and_finished_reach_both():
    matchmaker = FakeMatchmaker({})
    players = opponents(matchmaker)
    obs = boards(3, [3])
    assert players.act("random", obs).tolist() == [3, 3, 3]
    assert players.act("scripted", boards(1, list(range(9)))).tolist() == [4]
    players.finished("main@1", 1)
    players.finished("random", -1)
    assert matchmaker.results == [("main@1", 1), ("random", -1)]
    assert players.fixed.rates("main@1")["win_rate"] == 1.0
    assert players.fixed.rates("random")["loss_rate"] == 1.0
    alone = opponents(None, opponent="scripted")
    assert alone.choose() == "scripted"
    alone.finished("scripted", 0)
    assert alone.fixed.rates("scripted")["draw_rate"] == 1.0


def test_best_response_answers_the_models_greedy_policy_and_refreshes():
    # The model plays square 2 whenever it can: moving first, the best response wins along
    # a line that avoids 2 (the model does not block), so its replies are legal winning moves.
    players = opponents(model=forcing(2), opponent="best_response")
    assert players.choose() == "best_response"
    empty = boards(1, list(range(9)))
    first = players.act("best_response", empty)
    assert first.shape == (1,) and first[0] in players.best_response().moves[(0, 0)]
    responder = players.best_response()
    assert players.best_response() is responder  # searched once per refresh interval
    players.responded_at -= model_opponents.BEST_RESPONSE_REFRESH_S
    assert players.best_response() is not responder


def test_best_response_refuses_a_game_too_big_to_search():
    space = AgentObservationSpace((6, 7, 2), mask=7, state=0)
    fixed = FixedOpponents("best_response", space, 7, GAMES["connect_four"], seed=0)
    model = AgentActorCritic(space, 7, hidden=(8,))
    players = ModelOpponents(fixed, model, lambda: model, None)
    obs = np.zeros((1, space.shape[0]), np.float32)
    obs[:, space.features :] = 1.0
    with pytest.raises(UnknownOpponentError, match="tic-tac-toe"):
        players.act("best_response", obs)
