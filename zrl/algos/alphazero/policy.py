"""The AlphaZero actor policy: every move of the actor's self-play games chosen by search.

The env plays each game from both seats (``env.multiagent.self_play_seats: both``), so the
policy moves for whichever player is to move, and every observation is that player's view.
``act`` searches all of the actor's positions at once (:func:`~zrl.algos.alphazero.player.
searched_counts`: one forward per simulation for every game), with Dirichlet noise at the
roots, and plays the visit counts at temperature 1 for the first ``temperature_moves`` moves
of a game, the most visited move after (the first ``random_opening_moves`` uniformly at
random). ``finish`` keeps each game's (observation, visit
distribution) until the game ends, then sends them with the game's outcome from each
mover's view (``search_samples``); games still running carry over to the next trajectory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zrl.algos.alphazero.config import AlphaZeroConfig
from zrl.algos.alphazero.player import first_legal, model_evaluator, searched_counts
from zrl.algos.alphazero.search import SearchConfig, visit_policy
from zrl.algos.api.actor import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.envs.multiagent.games import board_game
from zrl.transport import protocol as P


def board_game_of(env_id: str) -> Any:
    """The board game of ``env.id`` (``pettingzoo/tictactoe_v3``); ValueError for another env."""
    game = board_game(env_id.partition("/")[2])
    if game is None:
        raise ValueError(
            f"alphazero searches the model of a k-in-a-row board game (pettingzoo/tictactoe_v3, "
            f"pettingzoo/connect_four_v3), not {env_id!r}"
        )
    return game


def game_outcomes(rewards: np.ndarray, passes: np.ndarray) -> np.ndarray:
    """Each move's outcome from its mover's view, for the moves of one finished game:
    ``rewards[-1]`` is the last mover's result; going back, the sign flips wherever the
    turn passed after a move (``passes``)."""
    out = np.empty(len(rewards), np.float32)
    value = float(np.sign(rewards[-1]))
    for i in range(len(rewards) - 1, -1, -1):
        if i < len(rewards) - 1 and passes[i]:
            value = -value
        out[i] = value
    return out


class AlphaZeroPolicy(BasePolicy):
    records_next_obs = False
    action_dtype = np.int64
    action_shape = ()

    def __init__(self, setup: ActorSetup) -> None:
        c = setup.config.section(AlphaZeroConfig)
        self.game = board_game_of(setup.config.env.id)
        self.evaluate = model_evaluator(setup.model)
        self.rng = setup.rng
        self.cfg = SearchConfig(c.simulations, c.c_puct, c.dirichlet_alpha, c.noise_fraction)
        self.temperature_moves = c.temperature_moves
        self.random_opening_moves = c.random_opening_moves
        self.moves = np.zeros(setup.num_envs, np.int64)
        """Moves made so far in each env's game."""
        self.open: list[list[tuple[np.ndarray, np.ndarray, float, bool]]] = [
            [] for _ in range(setup.num_envs)
        ]
        """Each env's game so far: (observation, visit distribution, reward, passes) per move."""
        self.evaluated = 0
        self.searches = 0
        self.games = 0

    def episodes_started(self, envs: np.ndarray) -> None:
        self.moves[envs] = 0

    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        counts, evaluated = searched_counts(self.game, obs, self.evaluate, self.cfg, self.rng)
        self.evaluated += evaluated
        live = counts.sum(axis=1) > 0
        self.searches += int(live.sum())
        actions = first_legal(obs, self.game)
        squares = self.game.rows * self.game.cols * 2
        legal = obs[:, squares : squares + self.game.num_actions] > 0.5
        policy = np.zeros(counts.shape, np.float32)
        for e in np.flatnonzero(live):
            policy[e] = visit_policy(counts[e], 1.0)
            if self.moves[e] < self.random_opening_moves:
                play = visit_policy(legal[e], 1.0)  # uniform over the legal moves
            else:
                temperature = 1.0 if self.moves[e] < self.temperature_moves else 0.0
                play = visit_policy(counts[e], temperature)
            actions[e] = self.rng.choice(len(play), p=play)
        move = self.moves.copy()
        self.moves += 1
        return actions, {"policy": policy, "move": move}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        """The samples of the games that ended in this trajectory."""
        E, T = trajectory.valid.shape
        passes = trajectory.extras.get("passes")
        if passes is None:
            raise ValueError(
                "alphazero needs the turn passes: env.multiagent.self_play_seats: both"
            )
        policy, move = trajectory.extras["policy"], trajectory.extras["move"]
        done = trajectory.terminated | trajectory.truncated
        obs_out: list[np.ndarray] = []
        pi_out: list[np.ndarray] = []
        z_out: list[np.ndarray] = []
        for e in range(E):
            game = self.open[e]
            for t in range(T):
                if not trajectory.valid[e, t]:
                    continue
                if move[e, t] == 0:  # a new game: what came before was cut off (an env error)
                    game.clear()
                game.append(
                    (
                        trajectory.obs[e, t],
                        policy[e, t],
                        float(trajectory.reward[e, t]),
                        bool(passes[e, t]),
                    )
                )
                if done[e, t]:
                    if trajectory.terminated[e, t]:
                        rewards = np.array([g[2] for g in game])
                        flips = np.array([g[3] for g in game])
                        obs_out.extend(g[0] for g in game)
                        pi_out.extend(g[1] for g in game)
                        z_out.append(game_outcomes(rewards, flips))
                        self.games += 1
                    game.clear()
        obs_dim, num_actions = trajectory.obs.shape[2], policy.shape[2]
        arrays = {
            "obs": np.array(obs_out, np.float32).reshape(-1, obs_dim),
            "policy": np.array(pi_out, np.float32).reshape(-1, num_actions),
            "value": np.concatenate(z_out).astype(np.float32) if z_out else np.zeros(0, np.float32),
        }
        return Outgoing(P.TRAJECTORY, arrays)

    def heartbeat_info(self) -> dict[str, Any]:
        return {
            "searches": self.searches,
            "search_evaluations": self.evaluated,
            "self_play_games": self.games,
        }
