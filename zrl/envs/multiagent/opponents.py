"""Who plays the agents of a multi-agent env that are not the learning policy's slots.

:class:`Opponents` is what the vector envs of ``zrl.envs.multiagent.envs`` ask: a name for each
episode's opponent, actions for a batch of that opponent's observations, and the result of
the episode. :class:`FixedOpponents` plays ``random``, ``scripted`` and the search players
(``perfect``, ``alphabeta2``, ``alphabeta4``: ``zrl.envs.multiagent.search``; no torch); the actor
adds its model's players (``self`` and league snapshots, ``zrl.roles.model_opponents``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from zrl.config.multiagent import FIXED_PLAYERS, SEARCH_PLAYERS
from zrl.envs.multiagent.games import BoardGame
from zrl.envs.multiagent.search import AlphaBetaPlayer, PerfectPlayer
from zrl.envs.multiagent.spaces import AgentObservationSpace

OUTCOMES = {1: "win", 0: "draw", -1: "loss"}
MAX_SOLVED_SQUARES = 9
"""The largest board the perfect player solves (tic-tac-toe's)."""


class Opponents(Protocol):
    def choose(self) -> str:
        """The opponent of a new episode."""

    def act(self, name: str, obs: np.ndarray) -> np.ndarray:
        """Actions ``[B]`` of the opponent ``name`` for slot observations ``obs [B, size]``."""

    def finished(self, name: str, outcome: int) -> None:
        """An episode against ``name`` ended: +1 the learning policy won, 0 draw, -1 lost."""


class UnknownOpponentError(ValueError):
    """An opponent name no player answers to; user-facing."""


class FixedOpponents:
    """Random legal moves, the game's scripted and search players; every episode's opponent is
    ``opponent``. Keeps win/draw/loss counts per opponent for whoever holds it to read (the
    evaluator scores its games from their returns, ``zrl.roles.evaluation.outcome_rates``)."""

    def __init__(
        self,
        opponent: str,
        space: AgentObservationSpace,
        num_actions: int,
        game: BoardGame | None,
        seed: int,
    ) -> None:
        self.opponent = opponent
        self.space = space
        self.num_actions = num_actions
        self.game = game
        self.rng = np.random.default_rng(seed)
        self.results: dict[str, np.ndarray] = {}
        self.searchers: dict[str, PerfectPlayer | AlphaBetaPlayer] = {}
        self.between_searches: Callable[[], None] | None = None
        """Called after each search move: a batch of alpha-beta searches takes seconds, and
        whoever plays them (the evaluator) must keep heartbeating meanwhile."""

    def choose(self) -> str:
        return self.opponent

    def act(self, name: str, obs: np.ndarray) -> np.ndarray:
        own, mask = self.space.split(obs)
        if mask is None:
            mask = np.ones((len(obs), self.num_actions), bool)
        if name == "random":
            # The argmax of i.i.d. uniform scores over the legal moves is a uniform legal move.
            scores = np.where(mask, self.rng.random(mask.shape), -1.0)
            return scores.argmax(axis=1)
        if name == "scripted":
            game = self.board_game(name)
            return np.array(
                [game.scripted_action(own[i], mask[i], self.rng) for i in range(len(obs))]
            )
        if name in SEARCH_PLAYERS:
            player = self.searcher(name)
            moves = []
            for i in range(len(obs)):
                moves.append(player.action(own[i], self.rng))
                if self.between_searches is not None:
                    self.between_searches()
            return np.array(moves)
        raise UnknownOpponentError(f"no opponent named {name!r} here ({', '.join(FIXED_PLAYERS)})")

    def board_game(self, name: str) -> BoardGame:
        if self.game is None:
            raise UnknownOpponentError(
                f"this env has no {name} player (tictactoe and connect_four have)"
            )
        return self.game

    def searcher(self, name: str) -> PerfectPlayer | AlphaBetaPlayer:
        """The search player ``name``, built once (the perfect player keeps what it solved)."""
        player = self.searchers.get(name)
        if player is None:
            game = self.board_game(name)
            if name == "perfect":
                if game.rows * game.cols > MAX_SOLVED_SQUARES:
                    raise UnknownOpponentError(
                        f"perfect: a {game.rows}x{game.cols} board is too big to solve; "
                        "play alphabeta2 or alphabeta4"
                    )
                player = PerfectPlayer(game)
            else:
                player = AlphaBetaPlayer(game, int(name.removeprefix("alphabeta")))
            self.searchers[name] = player
        return player

    def finished(self, name: str, outcome: int) -> None:
        counts = self.results.setdefault(name, np.zeros(3, np.int64))
        counts[1 - outcome] += 1  # win, draw, loss

    def rates(self, name: str) -> dict[str, float]:
        """Win/draw/loss shares of the finished episodes against ``name``."""
        counts = self.results.get(name, np.zeros(3, np.int64))
        total = max(int(counts.sum()), 1)
        return {f"{OUTCOMES[o]}_rate": float(counts[1 - o]) / total for o in (1, 0, -1)}
