"""PettingZoo envs as the actor's vector env (``zrl.envs.multiagent.envs``).

Turn-based (tic-tac-toe, connect four): the learning seat alternates per episode and game,
every move the env asks of an opponent is made on a legal mask that matches the board, the
learning slot sees masks of the empty squares, the slot's rewards add up to the game's result
(which the opponents hear), and NEXT_STEP autoreset holds; explicit policy mappings fix the
seat and name the players; bad mappings raise ``MultiAgentEnvError`` naming what is wrong.
Parallel (MPE simple spread): one slot per game and agent, the global state appended for a
central critic, episodes ending together, no opponent seats."""

from __future__ import annotations

import numpy as np
import pytest

from zrl.config.multiagent import MultiAgentConfig, is_multiagent
from zrl.envs.multiagent.envs import (
    ParallelVectorEnv,
    TurnBasedVectorEnv,
    make_multiagent_vector_env,
)
from zrl.envs.multiagent.games import GAMES, BoardGame
from zrl.envs.multiagent.opponents import FixedOpponents
from zrl.envs.multiagent.pettingzoo import MultiAgentEnvError, env_module, uses_parallel_api
from zrl.envs.multiagent.spaces import AgentObservationSpace

TICTACTOE = "pettingzoo/tictactoe_v3"
CONNECT_FOUR = "pettingzoo/connect_four_v3"
SPREAD = "mpe2/simple_spread_v3"


def board_legal(game: BoardGame, occupied: np.ndarray) -> np.ndarray:
    """The legal actions of a board (``occupied [rows, cols]``): its empty squares, or the
    columns that are not full."""
    return np.array([game.square(occupied, a) is not None for a in range(game.num_actions)])


def has_line(game: BoardGame, pieces: np.ndarray) -> bool:
    return any(game.wins(pieces, int(r), int(c)) for r, c in np.argwhere(pieces))


class CheckedOpponents:
    """Plays ``name`` with FixedOpponents, after checking every observation the env hands it:
    it is the opponent's turn (the mask is not empty), the mask is the board's legal moves,
    and the move returned is legal. Records who was asked and the results it heard."""

    def __init__(self, env: TurnBasedVectorEnv, game: BoardGame, name: str = "random") -> None:
        self.space = env.single_observation_space
        self.game = game
        self.fixed = FixedOpponents(name, self.space, game.num_actions, game, seed=3)
        self.asked: list[str] = []
        self.moves = 0
        self.results: list[tuple[str, int]] = []

    def choose(self) -> str:
        return self.fixed.opponent

    def act(self, name: str, obs: np.ndarray) -> np.ndarray:
        self.asked.append(name)
        own, mask = self.space.split(obs)
        assert mask is not None
        actions = self.fixed.act(name, obs)
        assert actions.shape == (len(obs),)
        for i, action in enumerate(actions):
            occupied = own[i].any(axis=-1)
            assert mask[i].any(), "an opponent was asked to move out of turn"
            np.testing.assert_array_equal(mask[i], board_legal(self.game, occupied))
            assert mask[i, action]
        self.moves += len(obs)
        return actions

    def finished(self, name: str, outcome: int) -> None:
        self.results.append((name, outcome))


def turn_based(env_id: str, num_games: int, **cfg) -> tuple[TurnBasedVectorEnv, CheckedOpponents]:
    env = make_multiagent_vector_env(env_id, {}, MultiAgentConfig(**cfg), num_games)
    assert isinstance(env, TurnBasedVectorEnv)
    game = GAMES[env_id.split("/")[1].rsplit("_v", 1)[0]]
    opponents = CheckedOpponents(env, game, name=cfg.get("opponent", "random"))
    env.opponents = opponents
    return env, opponents


def random_legal(obs: np.ndarray, space: AgentObservationSpace, rng) -> np.ndarray:
    _, mask = space.split(obs)
    assert mask is not None
    return np.where(mask, rng.random(mask.shape), -1.0).argmax(axis=1)


def play(env: TurnBasedVectorEnv, game: BoardGame, steps: int, seed: int = 0) -> dict:
    """Drive the learning slots with random legal moves for ``steps`` steps, checking on every
    step what the slot sees and gets; returns per game the seats of its episodes (as the env
    records them and as the first observation shows them), their returns and the outcomes
    the final boards show."""
    space = env.single_observation_space
    rng = np.random.default_rng(seed)
    n = env.num_envs
    seats: list[list[str]] = [[] for _ in range(n)]
    first_pieces: list[list[int]] = [[] for _ in range(n)]
    returns: list[list[float]] = [[] for _ in range(n)]
    board_outcomes: list[list[int]] = [[] for _ in range(n)]
    ended: list[tuple[int, float]] = []  # (game, return) in the order the env ends them
    running = np.zeros(n)

    def start(g: int, own: np.ndarray) -> None:
        seats[g].append(env.seat[g])
        first_pieces[g].append(int(own[g].sum()))

    obs, _ = env.reset(seed=seed)
    own, _ = space.split(obs)
    for g in range(n):
        start(g, own)
    done = np.zeros(n, bool)
    for _ in range(steps):
        own, mask = space.split(obs)
        for g in range(n):
            if done[g]:
                continue
            occupied = own[g].any(axis=-1)
            mine, theirs = int(own[g, ..., 0].sum()), int(own[g, ..., 1].sum())
            # (c) it is the slot's turn: the mask is the empty squares, and the piece counts
            # say who moved first
            assert mask[g].any()
            np.testing.assert_array_equal(mask[g], board_legal(game, occupied))
            assert theirs - mine == (0 if env.seat[g] == env.agents[0] else 1)
        obs, rewards, terminated, truncated, _ = env.step(random_legal(obs, space, rng))
        own, mask = space.split(obs)
        for g in range(n):
            if done[g]:  # (e) NEXT_STEP: this step only started a new game
                assert rewards[g] == 0.0 and not terminated[g] and not truncated[g]
                start(g, own)
                running[g] = 0.0
                continue
            running[g] += rewards[g]
            occupied = own[g].any(axis=-1)
            # (c) after the game, too, no occupied square (or full column) is marked legal
            assert (mask[g] <= board_legal(game, occupied)).all()
            if terminated[g] or truncated[g]:
                assert terminated[g] and not truncated[g]  # board games end by their rules
                mine, theirs = own[g, ..., 0] > 0, own[g, ..., 1] > 0
                outcome = 1 if has_line(game, mine) else -1 if has_line(game, theirs) else 0
                if outcome == 0:
                    assert not board_legal(game, occupied).any()  # a draw fills the board
                board_outcomes[g].append(outcome)
                returns[g].append(float(running[g]))
                ended.append((g, float(running[g])))
            else:
                assert rewards[g] == 0.0  # only the last move of a game is rewarded
        done = terminated | truncated
    return {
        "seats": seats,
        "first_pieces": first_pieces,
        "returns": returns,
        "board_outcomes": board_outcomes,
        "ended": ended,
    }


def test_tictactoe_default_mapping_alternates_seats_and_scores_games():
    env, opponents = turn_based(TICTACTOE, 6)
    game = GAMES["tictactoe"]
    try:
        assert env.single_observation_space == AgentObservationSpace((3, 3, 2), 9, 0)
        assert env.observation_space.shape == (6, 27)
        assert env.agents == ["player_1", "player_2"]
        seen = play(env, game, steps=150)
    finally:
        env.close()
    for g in range(env.num_envs):
        seats = seen["seats"][g]
        assert len(seen["returns"][g]) >= 10
        # (a) the learning seat alternates episode by episode, games starting out of phase
        assert seats[0] == env.agents[g % 2]
        assert all(a != b for a, b in zip(seats, seats[1:], strict=False)), seats
        # moving first means an empty board, second one opponent piece already down
        expected = [0 if seat == "player_1" else 1 for seat in seats]
        assert seen["first_pieces"][g] == expected
        # (d) an episode's rewards add up to the result on the board: +1, 0 or -1
        assert seen["returns"][g] == [float(o) for o in seen["board_outcomes"][g]]
    all_outcomes = {o for g in seen["board_outcomes"] for o in g}
    assert all_outcomes == {-1, 0, 1}
    # (d) the opponents hear every finished episode, with its sign, in order
    assert opponents.results == [("random", int(np.sign(r))) for _, r in seen["ended"]]
    # (b) every opponent move went through the checks; only the opponent was asked
    assert opponents.moves > 0 and set(opponents.asked) == {"random"}


def test_explicit_mapping_fixes_the_seat_and_plays_the_scripted_player():
    env, opponents = turn_based(
        TICTACTOE, 4, policy_mapping={"player_1": "main", "player_2": "scripted"}
    )
    game = GAMES["tictactoe"]
    try:
        seen = play(env, game, steps=60)
    finally:
        env.close()
    assert {s for seats in seen["seats"] for s in seats} == {"player_1"}
    assert {p for pieces in seen["first_pieces"] for p in pieces} == {0}  # always moves first
    assert set(opponents.asked) == {"scripted"}
    assert opponents.results == []  # no opponent seat: nothing to report to a league
    # random moves against the scripted player: it wins some, the slot (almost) never does
    outcomes = [o for g in seen["board_outcomes"] for o in g]
    assert -1 in outcomes and outcomes.count(1) <= len(outcomes) // 5


def test_explicit_second_seat_against_the_opponent():
    env, opponents = turn_based(TICTACTOE, 3, policy_mapping={"player_2": "main", "*": "opponent"})
    try:
        seen = play(env, GAMES["tictactoe"], steps=40)
    finally:
        env.close()
    assert {s for seats in seen["seats"] for s in seats} == {"player_2"}
    assert {p for pieces in seen["first_pieces"] for p in pieces} == {1}
    assert opponents.results == [("random", int(np.sign(r))) for _, r in seen["ended"]]
    assert opponents.results


def test_connect_four_random_games():
    env, opponents = turn_based(CONNECT_FOUR, 4)
    game = GAMES["connect_four"]
    try:
        assert env.single_observation_space == AgentObservationSpace((6, 7, 2), 7, 0)
        assert env.num_actions == 7
        seen = play(env, game, steps=70, seed=1)
    finally:
        env.close()
    for g in range(env.num_envs):
        seats = seen["seats"][g]
        assert len(seats) >= 2 and seats[0] == env.agents[g % 2]
        assert all(a != b for a, b in zip(seats, seats[1:], strict=False))
        assert seen["returns"][g] == [float(o) for o in seen["board_outcomes"][g]]
    assert opponents.results == [("random", int(np.sign(r))) for _, r in seen["ended"]]
    assert opponents.moves > 0


def test_unknown_agents_in_the_mapping_are_named():
    with pytest.raises(MultiAgentEnvError, match="player_3.*player_1, player_2"):
        make_multiagent_vector_env(
            TICTACTOE, {}, MultiAgentConfig(policy_mapping={"player_3": "main"}), 1
        )


def test_two_main_seats_in_a_turn_based_game_are_refused():
    mapping = {"player_1": "main", "player_2": "main"}
    with pytest.raises(MultiAgentEnvError, match="one main seat.*player_1.*player_2"):
        make_multiagent_vector_env(TICTACTOE, {}, MultiAgentConfig(policy_mapping=mapping), 1)


def test_agents_the_mapping_leaves_out_are_named():
    """A mapping that names some agents and has no "*" leaves the others without a player:
    refused when the env is made, naming them (not a failing opponent lookup mid-game)."""
    with pytest.raises(MultiAgentEnvError, match="no policy to player_2"):
        make_multiagent_vector_env(
            TICTACTOE, {}, MultiAgentConfig(policy_mapping={"player_1": "main"}), 1
        )
    with pytest.raises(MultiAgentEnvError, match="no policy to agent_1, agent_2"):
        make_multiagent_vector_env(
            SPREAD, {}, MultiAgentConfig(policy_mapping={"agent_0": "main"}), 1
        )


def test_env_module_resolution_and_unknown_ids():
    assert env_module(TICTACTOE).__name__ == "pettingzoo.classic.tictactoe_v3"
    assert env_module(CONNECT_FOUR).__name__ == "pettingzoo.classic.connect_four_v3"
    assert env_module(SPREAD).__name__ == "mpe2.simple_spread_v3"
    with pytest.raises(MultiAgentEnvError, match="no PettingZoo env 'pettingzoo/nogame_v1'"):
        env_module("pettingzoo/nogame_v1")
    with pytest.raises(MultiAgentEnvError, match="mpe2.nogame_v1"):
        env_module("mpe2/nogame_v1")
    assert is_multiagent(TICTACTOE) and is_multiagent(SPREAD)
    assert not is_multiagent("CartPole-v1") and not is_multiagent("pettingzoo")
    assert not is_multiagent("ALE/Pong-v5")


def test_api_choice():
    classic, mpe = env_module(TICTACTOE), env_module(SPREAD)
    assert not uses_parallel_api(MultiAgentConfig(), classic)
    assert uses_parallel_api(MultiAgentConfig(), mpe)
    assert not uses_parallel_api(MultiAgentConfig(api="aec"), mpe)
    with pytest.raises(MultiAgentEnvError, match="no parallel_env"):
        uses_parallel_api(MultiAgentConfig(api="parallel"), classic)


def test_parallel_central_value_slots_and_episode_ends():
    env = make_multiagent_vector_env(
        SPREAD, {"max_cycles": 4}, MultiAgentConfig(central_value=True), 2
    )
    try:
        assert isinstance(env, ParallelVectorEnv)
        assert env.num_envs == 2 * 3  # games x agents
        assert env.slots == ["agent_0", "agent_1", "agent_2"]
        space = env.single_observation_space
        assert space == AgentObservationSpace((18,), 0, 54)
        assert repr(space) == "AgentObservationSpace(features=(18,), mask=0, state=54)"
        obs, _ = env.reset(seed=0)
        assert obs.shape == (6, 72) and obs.dtype == np.float32

        def check_layout(obs: np.ndarray) -> None:
            for g in range(2):
                state = env.games[g].state()
                for i, agent in enumerate(env.slots):
                    row = obs[g * 3 + i]
                    np.testing.assert_allclose(row[18:], state.ravel(), rtol=1e-6)
                    np.testing.assert_allclose(row[:18], env.last_obs[g][agent], rtol=1e-6)

        check_layout(obs)
        rng = np.random.default_rng(0)
        for cycle in range(1, 4 * 2 + 3):
            obs, rewards, terminated, truncated, _ = env.step(rng.integers(0, 5, 6))
            assert not terminated.any()
            if cycle in (4, 9):  # max_cycles: every slot of every game truncated together
                assert truncated.all()
            elif cycle in (5, 10):  # NEXT_STEP: the step after only resets (reward 0, not done)
                assert not truncated.any() and np.all(rewards == 0.0)
                check_layout(obs)
            else:
                assert not truncated.any()
                assert np.all(rewards != 0.0)  # simple spread rewards every step
                check_layout(obs)
    finally:
        env.close()


def test_parallel_without_state_and_with_a_random_agent():
    mapping = {"agent_1": "random", "*": "main"}
    env = make_multiagent_vector_env(
        SPREAD, {"max_cycles": 3}, MultiAgentConfig(policy_mapping=mapping), 3
    )
    asked = []

    class Recording(FixedOpponents):
        def act(self, name, obs):
            asked.append((name, obs.shape))
            return super().act(name, obs)

    env.opponents = Recording("random", env.single_observation_space, env.num_actions, None, 0)
    try:
        assert env.single_observation_space == AgentObservationSpace((18,), 0, 0)
        assert env.slots == ["agent_0", "agent_2"] and env.num_envs == 3 * 2
        obs, _ = env.reset(seed=0)
        assert obs.shape == (6, 18)
        env.step(np.zeros(6, np.int64))
    finally:
        env.close()
    assert asked == [("random", (3, 18))]  # agent_1 of each game, batched


def test_parallel_env_refuses_opponent_seats():
    mapping = {"agent_0": "opponent", "*": "main"}
    with pytest.raises(MultiAgentEnvError, match="opponent seats are for turn-based games"):
        make_multiagent_vector_env(SPREAD, {}, MultiAgentConfig(policy_mapping=mapping), 1)
    with pytest.raises(MultiAgentEnvError, match="maps no agent to main"):
        make_multiagent_vector_env(SPREAD, {}, MultiAgentConfig(policy_mapping={"*": "random"}), 1)


def test_bad_env_kwargs_are_named():
    with pytest.raises(MultiAgentEnvError, match="env.kwargs"):
        make_multiagent_vector_env(SPREAD, {"no_such_arg": 1}, MultiAgentConfig(), 1)


@pytest.mark.parametrize("illegal", [4, 9, -1], ids=["occupied", "past-the-end", "negative"])
def test_an_illegal_move_of_the_learning_policy_forfeits_the_game(illegal):
    """The move is checked on the mask the slot saw: an occupied square or an action out of
    range loses the game at once (reward -1, terminated), the opponent hears a win for it,
    the env counts it, and the next step only starts a new game."""
    env, opponents = turn_based(TICTACTOE, 1)
    try:
        obs, _ = env.reset(seed=0)
        assert env.seat[0] == "player_1"
        obs, rewards, terminated, _, _ = env.step(np.array([4]))  # the centre, legal
        assert not terminated[0] and rewards[0] == 0.0
        board = obs.copy()
        obs, rewards, terminated, truncated, _ = env.step(np.array([illegal]))
        assert rewards[0] == -1.0 and terminated[0] and not truncated[0]
        np.testing.assert_array_equal(obs[:, :18], board[:, :18])  # the move was not made
        assert env.illegal_moves == 1
        assert env.heartbeat_info() == {"illegal_moves": 1}
        assert opponents.results == [("random", -1)]
        obs, rewards, terminated, truncated, _ = env.step(np.array([0]))
        assert rewards[0] == 0.0 and not terminated[0] and not truncated[0]
        assert env.seat[0] == "player_2" and obs[0, :18].sum() == 1  # a new game, seat swapped
    finally:
        env.close()


def test_an_illegal_move_of_an_opponent_is_an_error():
    class Cheater(FixedOpponents):
        def act(self, name, obs):
            _, mask = self.space.split(obs)
            return (~mask).argmax(axis=1)  # the first occupied square

    env = make_multiagent_vector_env(TICTACTOE, {}, MultiAgentConfig(opponent="random"), 1)
    env.opponents = Cheater("random", env.single_observation_space, 9, None, seed=0)
    try:
        env.reset(seed=0)
        with pytest.raises(MultiAgentEnvError, match="opponent 'random' played illegal move 4"):
            env.step(np.array([4]))
    finally:
        env.close()


def test_scripted_seats_play_without_given_opponents():
    """A probe (preflight's reset, the evaluator's spaces) makes the env without opponents: a
    seat mapped to scripted still gets the game's scripted player."""
    mapping = {"player_1": "scripted", "player_2": "main"}
    env = make_multiagent_vector_env(TICTACTOE, {}, MultiAgentConfig(policy_mapping=mapping), 2)
    try:
        obs, _ = env.reset(seed=0)
        own, _ = env.single_observation_space.split(obs)
        assert (own[:, 1, 1, 1] == 1).all()  # the scripted first move: the centre
    finally:
        env.close()


class SelfAndRandom:
    """Even games against ``self``, odd games against random moves; ``self`` is never asked
    to move in a game played from both seats."""

    def __init__(self, env: TurnBasedVectorEnv, game: BoardGame) -> None:
        self.fixed = FixedOpponents("random", env.single_observation_space, 9, game, seed=5)
        self.next = 0
        self.results: list[tuple[str, int]] = []

    def choose(self) -> str:
        self.next += 1
        return "self" if self.next % 2 else "random"

    def act(self, name: str, obs: np.ndarray) -> np.ndarray:
        assert name == "random", "a game played from both seats asked its opponent to move"
        return self.fixed.act(name, obs)

    def finished(self, name: str, outcome: int) -> None:
        self.results.append((name, outcome))


def test_self_play_from_both_seats_moves_for_the_seat_to_move_and_says_the_turn_passed():
    env = make_multiagent_vector_env(
        "pettingzoo/tictactoe_v3", {}, MultiAgentConfig(self_play_seats="both"), 2
    )
    assert isinstance(env, TurnBasedVectorEnv) and env.step_info == ("passes",)
    env.opponents = opponents = SelfAndRandom(env, GAMES["tictactoe"])
    space = env.single_observation_space
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    assert list(env.plays_both) == [True, False]
    moves = {0: 0, 1: 0}
    both_rewards: list[float] = []
    for _ in range(40):
        movers = list(env.seat)
        pieces_before = [int(space.split(obs)[0][g].sum()) for g in range(2)]
        playing = list(env.plays_both)
        restarting = env.over.copy()
        obs, reward, terminated, _, info = env.step(random_legal(obs, space, rng))
        for g in range(2):
            if restarting[g]:
                assert not info["passes"][g]  # a reset step moves nobody
                continue
            moves[g] += 1
            if playing[g]:
                if terminated[g]:
                    assert not info["passes"][g]
                    assert reward[g] in (0.0, 1.0)  # the mover wins or draws on its move
                    both_rewards.append(float(reward[g]))
                else:
                    # The slot now moves for the other seat, which sees one more piece.
                    assert info["passes"][g] and env.seat[g] != movers[g]
                    assert int(space.split(obs)[0][g].sum()) == pieces_before[g] + 1
            else:
                assert not info["passes"][g] and env.seat[g] == movers[g]
    assert moves[0] > 0 and moves[1] > 0 and both_rewards
    # A game against itself is even for the league; games against random keep their result.
    assert {o for name, o in opponents.results if name == "self"} == {0}
    assert any(name == "random" for name, _ in opponents.results)


def test_both_seats_is_off_by_default():
    env, _ = turn_based("pettingzoo/tictactoe_v3", 2)
    assert env.step_info == () and not env.both_seats
    env.reset(seed=0)
    *_, info = env.step(np.zeros(2, np.int64) + 4)
    assert info == {}
