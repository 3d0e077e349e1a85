"""PUCT tree search (AlphaZero's MCTS) over a k-in-a-row board game's own model, for many
games at once.

The pieces are small pure functions: :func:`puct_scores` and :func:`select` (PUCT),
:func:`expand` (priors over the legal moves), :func:`backup` (the leaf's value up the path,
its sign flipped at every ply: two-player zero-sum), :func:`add_root_noise` (Dirichlet noise
at the root) and :func:`visit_policy` (visit counts at a temperature). :func:`search` runs
one tree per position, several positions at once: each simulation descends every tree to
one leaf and evaluates all the leaves in one ``evaluate`` call (one model forward), so an
actor's games share their forwards.

Positions are ``(mine, theirs)`` bitboards of the player to move
(``zrl.envs.multiagent.search.Bitboards``); every value is from the view of the player to
move at the node it belongs to. No sockets, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zrl.envs.multiagent.games import BoardGame
from zrl.envs.multiagent.search import Bitboards

Evaluate = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""Observations ``[B, O]`` (the env's slot observations) -> ``(priors [B, A], values [B])``:
the priors a distribution over the legal moves, the values in [-1, 1] for the player to move."""


@dataclass
class Node:
    """A position in a search tree and the statistics of its moves (edges)."""

    mine: int
    theirs: int
    terminal: float | None = None
    """The game's result for the player to move when the game is over here (-1: the other
    player just completed a line; 0: the board is full), else None."""
    actions: list[int] = field(default_factory=list)
    bits: list[int] = field(default_factory=list)
    prior: list[float] = field(default_factory=list)
    visits: list[float] = field(default_factory=list)
    value_sum: list[float] = field(default_factory=list)
    """Per move: the sum of the backed-up values, from this node's player to move's view.
    (Python lists: a node has at most a few moves, where numpy's per-call cost dominates.)"""
    children: list[Node | None] = field(default_factory=list)

    @property
    def expanded(self) -> bool:
        return len(self.actions) > 0


def puct_scores(
    prior: Sequence[float], visits: Sequence[float], value_sum: Sequence[float], c_puct: float
) -> list[float]:
    """``Q + U`` of each move: ``Q = W / N`` (0 for an unvisited move) and
    ``U = c_puct * P * sqrt(max(1, sum N)) / (1 + N)`` (AlphaZero's PUCT; the ``max`` lets
    the priors choose the first visit)."""
    scale = c_puct * math.sqrt(max(1.0, float(sum(visits))))
    return [
        (w / n if n else 0.0) + scale * p / (1.0 + n)
        for p, n, w in zip(prior, visits, value_sum, strict=True)
    ]


def select(node: Node, c_puct: float) -> int:
    """The index (into ``node.actions``) of the move of the highest PUCT score, the first
    of equal ones."""
    scores = puct_scores(node.prior, node.visits, node.value_sum, c_puct)
    return max(range(len(scores)), key=scores.__getitem__)


def expand(node: Node, boards: Bitboards, priors: np.ndarray) -> None:
    """Give ``node`` its legal moves with their priors (``priors [A]`` over every action,
    renormalised over the legal ones; uniform where they hold no mass)."""
    moves = boards.moves(node.mine | node.theirs)
    node.actions = [a for a, _ in moves]
    node.bits = [b for _, b in moves]
    p = [max(float(priors[a]), 0.0) for a in node.actions]
    total = sum(p)
    n = len(p)
    node.prior = [x / total for x in p] if total > 0 else [1.0 / n] * n
    node.visits = [0.0] * n
    node.value_sum = [0.0] * n
    node.children = [None] * n


def child(node: Node, i: int, boards: Bitboards) -> Node:
    """The position after move ``i`` of ``node`` (made once, then kept): the other player
    to move, and terminal when the move completed a line or filled the board."""
    made = node.children[i]
    if made is None:
        bit = node.bits[i]
        after = node.mine | bit
        made = Node(node.theirs, after)
        if boards.completes_line(after, bit):
            made.terminal = -1.0
        elif not boards.moves(made.mine | made.theirs):
            made.terminal = 0.0
        node.children[i] = made
    return made


def backup(path: list[tuple[Node, int]], value: float) -> None:
    """Add the leaf's ``value`` (for the player to move at the leaf) to every edge of
    ``path`` (``(node, move index)`` from the root down): each edge's node has the other
    player to move than its child, so the sign flips at every ply."""
    for node, i in reversed(path):
        value = -value
        node.visits[i] += 1.0
        node.value_sum[i] += value


def add_root_noise(node: Node, alpha: float, fraction: float, rng: np.random.Generator) -> None:
    """AlphaZero's exploration at the root: ``P = (1 - fraction) P + fraction Dir(alpha)``."""
    if fraction > 0 and len(node.prior) > 1:
        noise = rng.dirichlet(np.full(len(node.prior), alpha))
        node.prior = [
            (1.0 - fraction) * p + fraction * float(x)
            for p, x in zip(node.prior, noise, strict=True)
        ]


def visit_policy(visits: np.ndarray, temperature: float) -> np.ndarray:
    """The move distribution of visit counts at ``temperature``: ``N^(1/T)`` normalised; at
    0 all mass on the most visited moves, shared equally among ties."""
    visits = np.asarray(visits, np.float64)
    if temperature <= 0:
        top = visits == visits.max()
        return top / top.sum()  # type: ignore[no-any-return]
    scaled = visits ** (1.0 / temperature)
    total = scaled.sum()
    return scaled / total if total > 0 else np.full(len(visits), 1.0 / len(visits))


@dataclass(frozen=True)
class SearchConfig:
    simulations: int
    c_puct: float = 1.5
    dirichlet_alpha: float = 0.3
    noise_fraction: float = 0.0
    """0: no root noise (evaluation)."""


def descend(root: Node, boards: Bitboards, c_puct: float) -> tuple[list[tuple[Node, int]], Node]:
    """From ``root`` by PUCT to a leaf: an unexpanded or terminal node, and the path there."""
    path: list[tuple[Node, int]] = []
    node = root
    while node.expanded and node.terminal is None:
        i = select(node, c_puct)
        path.append((node, i))
        node = child(node, i, boards)
    return path, node


def observations(game: BoardGame, positions: list[tuple[int, int]]) -> np.ndarray:
    """The slot observations ``[B, rows * cols * 2 + num_actions]`` of positions, as
    ``zrl.envs.multiagent.search.observation`` makes each one (planes of the player to
    move's pieces and the other's, then the legal-move mask), built for all at once."""
    n = game.rows * game.cols
    if not positions:
        return np.zeros((0, 2 * n + game.num_actions), np.float32)
    squares = np.arange(n, dtype=np.int64)
    pieces = np.array(positions, np.int64)  # [B, 2]: 42 squares fit in int64
    planes = (pieces[:, None, :] >> squares[None, :, None]) & 1  # [B, n, 2]
    occupied = pieces[:, 0] | pieces[:, 1]
    if game.gravity:  # a column is open while its top square (row 0) is empty
        free = (occupied[:, None] >> np.arange(game.cols, dtype=np.int64)) & 1
    else:
        free = (occupied[:, None] >> squares) & 1
    out = np.empty((len(positions), 2 * n + game.num_actions), np.float32)
    out[:, : 2 * n] = planes.reshape(len(positions), 2 * n)
    out[:, 2 * n :] = 1 - free
    return out


def search(
    game: BoardGame,
    positions: list[tuple[int, int]],
    evaluate: Evaluate,
    cfg: SearchConfig,
    rng: np.random.Generator,
) -> tuple[list[Node], int]:
    """One tree per position (the player to move's ``(mine, theirs)``, none of them over),
    searched ``cfg.simulations`` times each. Every simulation evaluates the new leaves of
    all trees in one ``evaluate`` call; a terminal leaf backs up the game's result without
    one. Returns the roots (their ``visits`` are the search's move counts) and the number
    of positions evaluated."""
    boards = Bitboards(game)
    roots = [Node(m, t) for m, t in positions]
    if not roots:
        return roots, 0
    priors, _ = evaluate(observations(game, positions))
    for root, p in zip(roots, priors, strict=True):
        expand(root, boards, p)
        add_root_noise(root, cfg.dirichlet_alpha, cfg.noise_fraction, rng)
    evaluated = len(roots)
    for _ in range(cfg.simulations):
        pending: list[tuple[list[tuple[Node, int]], Node]] = []
        for root in roots:
            path, leaf = descend(root, boards, cfg.c_puct)
            if leaf.terminal is not None:
                backup(path, leaf.terminal)
            else:
                pending.append((path, leaf))
        if not pending:
            continue
        priors, values = evaluate(
            observations(game, [(leaf.mine, leaf.theirs) for _, leaf in pending])
        )
        evaluated += len(pending)
        for (path, leaf), p, v in zip(pending, priors, values, strict=True):
            expand(leaf, boards, p)
            backup(path, float(np.clip(v, -1.0, 1.0)))
    return roots, evaluated


def mirror_indices(game: BoardGame) -> tuple[np.ndarray, np.ndarray]:
    """The left-right mirror of a k-in-a-row game as index arrays ``(obs [O], actions [A])``:
    ``obs[:, o]`` is the observation of the mirrored position (``observations``' layout:
    planes ``[rows, cols, 2]`` flattened, then the legal-move mask) and ``policy[:, a]`` the
    move distribution over it. A line mirrored is a line, so the position's value is the
    same: every self-play sample has a second, free one (AlphaZero's symmetry augmentation)."""
    rows, cols, n = game.rows, game.cols, game.rows * game.cols
    square = np.arange(n).reshape(rows, cols)[:, ::-1].ravel()  # the mirror of each square
    if game.gravity:  # an action is a column
        actions = np.arange(cols)[::-1].copy()
    else:  # an action is a square (``Bitboards.moves`` on an empty board lists them all)
        moves = Bitboards(game).moves(0)
        of_square = {bit.bit_length() - 1: a for a, bit in moves}
        actions = np.array([of_square[square[bit.bit_length() - 1]] for _, bit in moves])
    planes = (2 * square[:, None] + np.arange(2)[None, :]).ravel()
    return np.concatenate([planes, 2 * n + actions]), actions


def root_counts(root: Node, num_actions: int) -> np.ndarray:
    """A root's visit counts over every action ``[A]`` (0 for illegal moves)."""
    out = np.zeros(num_actions)
    out[root.actions] = root.visits
    return out
