"""The network as the search's evaluator, and the search as a player: what the self-play
actor and the evaluator share.

:func:`model_evaluator` turns a policy-value model (``model(obs) -> (masked logits,
value)``, zrl's multi-agent actor-critic) into the search's ``evaluate``; :class:`SearchPlayer`
plays the most visited move of a noise-free search (``act(obs, deterministic=True)``, so
the evaluator's greedy loop and the exploitability search can play it like a model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.alphazero.config import AlphaZeroConfig
from zrl.algos.alphazero.search import Evaluate, SearchConfig, root_counts, search
from zrl.envs.multiagent.games import BoardGame
from zrl.envs.multiagent.search import Bitboards, from_planes


def model_evaluator(model: Any) -> Evaluate:
    """``evaluate`` of the search by one forward of ``model``: softmax priors over the
    (already masked) logits, values clipped to [-1, 1]."""

    @torch.no_grad()
    def evaluate(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, values = model(torch.from_numpy(np.ascontiguousarray(obs, np.float32)))
        priors = torch.softmax(logits.float(), dim=1)
        return priors.numpy(), values.float().clamp(-1.0, 1.0).numpy()

    return evaluate


def game_over(boards: Bitboards, mine: int, theirs: int) -> bool:
    """Whether a position is no position to move in: a line completed, or the board full
    (the observation an env shows after a game's last move)."""
    if not boards.moves(mine | theirs):
        return True
    return any(p & line == line for p in (mine, theirs) for line in boards.lines)


def positions_of(game: BoardGame, obs: np.ndarray) -> list[tuple[int, int]]:
    """``(mine, theirs)`` of each slot observation ``obs [B, O]`` (planes then mask)."""
    n = game.rows * game.cols * 2
    planes = obs[:, :n].reshape(len(obs), game.rows, game.cols, 2)
    return [from_planes(p) for p in planes]


def searched_counts(
    game: BoardGame,
    obs: np.ndarray,
    evaluate: Evaluate,
    cfg: SearchConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """The search's visit counts ``[B, A]`` for observations ``obs [B, O]``, all positions
    searched together (zero rows for positions where the game is over), and the positions
    evaluated."""
    boards = Bitboards(game)
    positions = positions_of(game, obs)
    live = [i for i, (m, t) in enumerate(positions) if not game_over(boards, m, t)]
    roots, evaluated = search(game, [positions[i] for i in live], evaluate, cfg, rng)
    counts = np.zeros((len(obs), game.num_actions))
    for i, root in zip(live, roots, strict=True):
        counts[i] = root_counts(root, game.num_actions)
    return counts, evaluated


def first_legal(obs: np.ndarray, game: BoardGame) -> np.ndarray:
    """The first legal action of each observation (0 where none): the move of a row whose
    game is over, which the env ignores."""
    n = game.rows * game.cols * 2
    mask = obs[:, n : n + game.num_actions] > 0.5
    return np.where(mask.any(axis=1), mask.argmax(axis=1), 0)


class SearchPlayer:
    """The most visited move of a noise-free search with ``simulations`` simulations (ties
    broken at random), in the interface of a model's greedy action."""

    def __init__(
        self, model: Any, game: BoardGame, simulations: int, c_puct: float, seed: int = 0
    ) -> None:
        self.evaluate = model_evaluator(model)
        self.game = game
        self.cfg = SearchConfig(simulations=simulations, c_puct=c_puct)
        self.rng = np.random.default_rng(seed)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        """Moves ``[B]`` for observations ``[B, O]``."""
        counts, _ = searched_counts(self.game, obs, self.evaluate, self.cfg, self.rng)
        noise = self.rng.random(counts.shape)  # random among the most visited
        best = np.where(counts == counts.max(axis=1, keepdims=True), noise, -1.0).argmax(axis=1)
        return np.where(counts.sum(axis=1) > 0, best, first_legal(obs, self.game))

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return torch.from_numpy(self.actions(obs.numpy()))


def search_player(model: Any, config: Any, game: BoardGame, seed: int) -> SearchPlayer | None:
    """The evaluator's search player (``Algorithm.search_player``): ``alphazero.
    eval_simulations`` simulations per move, None when that is 0."""
    c = config.section(AlphaZeroConfig)
    if c.eval_simulations == 0:
        return None
    return SearchPlayer(model, game, c.eval_simulations, c.c_puct, seed)
