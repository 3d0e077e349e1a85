"""Strong players of the k-in-a-row board games (``zrl.envs.multiagent.games``), and how much a
policy can be beaten by one.

- :class:`PerfectPlayer`: full game-tree search (negamax over every position, memoised), for
  games small enough to solve (tic-tac-toe: 5,478 positions). It picks among the moves of the
  best value at random (``tie_break="random"``, so that it probes every line the agent may
  have left open), or always the first of them (``"first"``).
- :class:`AlphaBetaPlayer`: depth-limited alpha-beta (connect four): a win found within
  ``depth`` plies is taken, the sooner the better; leaves are scored by the lines of k still open
  to each player (:func:`line_score`); ties at the root broken at random.
- :func:`exploitability`: the best response to a deterministic (greedy) policy, found by
  exhaustive search over every opponent move from both seats: whether it forces a win and
  along how many opponent lines the policy loses.
- :func:`best_response`: that best response as a player (:class:`BestResponse`), for training
  against the lines a policy still loses (``best_response`` opponent of a league or a run).

Positions are two integer bitboards, the pieces of the player to move first (``mine``,
``theirs``); square ``r * cols + c`` is bit ``r * cols + c``, and an action is a square (a
column with gravity), as in :class:`~zrl.envs.multiagent.games.BoardGame`. The observation a
policy sees is the env's: planes ``[rows, cols, 2]`` (the player to move's pieces, then the
other's) flattened, then the legal-move mask (:func:`observation`).

No sockets, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from zrl.envs.multiagent.games import DIRECTIONS, BoardGame, board_game

WIN = 1_000_000
"""An alpha-beta score for a win now; a win d plies away scores WIN - d."""
LINE_WEIGHTS = (0, 1, 8, 64)
"""The score of a line of k (k = 4) open to one player only, by how many of its squares the
player holds (a line of 4 is a win, scored apart)."""

Policy = Callable[[np.ndarray], np.ndarray]
"""Greedy actions ``[B]`` for observations ``[B, rows * cols * 2 + num_actions]``."""


@dataclass(frozen=True)
class Bitboards:
    """A :class:`BoardGame`'s squares and lines as bit masks."""

    game: BoardGame

    @cached_property
    def lines(self) -> tuple[int, ...]:
        """Every line of k squares (row, column, diagonal) as a mask."""
        g, out = self.game, []
        for r in range(g.rows):
            for c in range(g.cols):
                for dr, dc in DIRECTIONS:
                    cells = [(r + i * dr, c + i * dc) for i in range(g.k)]
                    if all(0 <= rr < g.rows and 0 <= cc < g.cols for rr, cc in cells):
                        out.append(sum(1 << (rr * g.cols + cc) for rr, cc in cells))
        return tuple(out)

    @cached_property
    def lines_through(self) -> tuple[tuple[int, ...], ...]:
        """For each square, the lines through it."""
        n = self.game.rows * self.game.cols
        return tuple(tuple(line for line in self.lines if line >> sq & 1) for sq in range(n))

    @property
    def full(self) -> int:
        return (1 << (self.game.rows * self.game.cols)) - 1

    def moves(self, occupied: int) -> list[tuple[int, int]]:
        """(action, square bit) of every legal move."""
        g = self.game
        if not g.gravity:
            return [(sq, 1 << sq) for sq in range(g.rows * g.cols) if not occupied >> sq & 1]
        out = []
        for c in range(g.cols):
            for r in range(g.rows - 1, -1, -1):
                sq = r * g.cols + c
                if not occupied >> sq & 1:
                    out.append((c, 1 << sq))
                    break
        return out

    def completes_line(self, pieces: int, bit: int) -> bool:
        """Whether the piece ``bit`` (already in ``pieces``) completes a line of k."""
        return any(pieces & line == line for line in self.lines_through[bit.bit_length() - 1])


def from_planes(planes: np.ndarray) -> tuple[int, int]:
    """``(mine, theirs)`` bitboards of observation planes ``[rows, cols, 2]``."""
    bits = 1 << np.arange(planes.shape[0] * planes.shape[1], dtype=object)
    mine = int((planes[..., 0].ravel() > 0) @ bits) if planes.size else 0
    theirs = int((planes[..., 1].ravel() > 0) @ bits) if planes.size else 0
    return mine, theirs


def observation(game: BoardGame, mine: int, theirs: int) -> np.ndarray:
    """The slot observation of the player to move: planes ``[rows, cols, 2]`` flattened, then
    the legal-move mask (``zrl.envs.multiagent.spaces.encode``)."""
    n = game.rows * game.cols
    squares = np.arange(n)
    planes = np.zeros((n, 2), np.float32)
    planes[:, 0] = (mine >> squares) & 1
    planes[:, 1] = (theirs >> squares) & 1
    mask = np.zeros(game.num_actions, np.float32)
    for action, _ in Bitboards(game).moves(mine | theirs):
        mask[action] = 1.0
    return np.concatenate([planes.ravel(), mask])


@dataclass
class PerfectPlayer:
    """Perfect play by full search: ``value`` of every position, memoised."""

    game: BoardGame
    tie_break: Literal["random", "first"] = "random"
    boards: Bitboards = field(init=False)
    values: dict[tuple[int, int], int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.boards = Bitboards(self.game)

    def value(self, mine: int, theirs: int) -> int:
        """+1 when the player to move wins with perfect play, 0 draw, -1 loss."""
        key = (mine, theirs)
        known = self.values.get(key)
        if known is not None:
            return known
        best = 0 if not self.boards.moves(mine | theirs) else -1
        for _, bit in self.boards.moves(mine | theirs):
            best = max(best, self.move_value(mine, theirs, bit))
            if best == 1:
                break
        self.values[key] = best
        return best

    def move_value(self, mine: int, theirs: int, bit: int) -> int:
        """The value, for the player to move, of playing square ``bit``."""
        after = mine | bit
        if self.boards.completes_line(after, bit):
            return 1
        return -self.value(theirs, after)

    def best_actions(self, mine: int, theirs: int) -> list[int]:
        """The legal actions of the best value, in action order."""
        scored = [
            (a, self.move_value(mine, theirs, bit)) for a, bit in self.boards.moves(mine | theirs)
        ]
        top = max(v for _, v in scored)
        return [a for a, v in scored if v == top]

    def action(self, planes: np.ndarray, rng: np.random.Generator) -> int:
        """The move for the player to move of ``planes [rows, cols, 2]``."""
        best = self.best_actions(*from_planes(planes))
        return best[0] if self.tie_break == "first" else best[int(rng.integers(len(best)))]


def line_score(boards: Bitboards, mine: int, theirs: int) -> int:
    """The lines still open to the player to move less those open to the other player, each
    weighted by how many of its squares the player holds (:data:`LINE_WEIGHTS`)."""
    score = 0
    for line in boards.lines:
        a, b = mine & line, theirs & line
        if a and not b:
            score += LINE_WEIGHTS[min(a.bit_count(), len(LINE_WEIGHTS) - 1)]
        elif b and not a:
            score -= LINE_WEIGHTS[min(b.bit_count(), len(LINE_WEIGHTS) - 1)]
    return score


@dataclass
class AlphaBetaPlayer:
    """Depth-limited alpha-beta over ``depth`` plies (at least 1)."""

    game: BoardGame
    depth: int
    boards: Bitboards = field(init=False)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"alpha-beta depth {self.depth}: at least 1")
        self.boards = Bitboards(self.game)

    def search(self, mine: int, theirs: int, depth: int, alpha: float, beta: float) -> float:
        """Negamax score of the position for the player to move, searched ``depth`` plies."""
        moves = self.boards.moves(mine | theirs)
        if not moves:
            return 0
        if depth == 0:
            return line_score(self.boards, mine, theirs)
        best = -float("inf")
        for _, bit in moves:
            score = self.move_score(mine, theirs, bit, depth, -beta, -alpha)
            best = max(best, score)
            alpha = max(alpha, score)
            if alpha >= beta:
                break
        return best

    def move_score(
        self, mine: int, theirs: int, bit: int, depth: int, alpha: float, beta: float
    ) -> float:
        after = mine | bit
        if self.boards.completes_line(after, bit):
            return WIN + depth  # a win now outscores one found deeper (fewer plies left)
        return -self.search(theirs, after, depth - 1, alpha, beta)

    def scores(self, mine: int, theirs: int) -> dict[int, float]:
        """Each legal action's exact score (a full window per root move)."""
        inf = float("inf")
        return {
            a: self.move_score(mine, theirs, bit, self.depth, -inf, inf)
            for a, bit in self.boards.moves(mine | theirs)
        }

    def action(self, planes: np.ndarray, rng: np.random.Generator) -> int:
        scores = self.scores(*from_planes(planes))
        top = max(scores.values())
        best = [a for a, s in scores.items() if s == top]
        return best[int(rng.integers(len(best)))]


MAX_ENUMERATED_SQUARES = 9
"""The largest board :func:`exploitability` searches (tic-tac-toe's 3x3)."""


def enumerable_game(env_id: str) -> BoardGame | None:
    """The board game of a multi-agent env id (``pettingzoo/tictactoe_v3``) when it is small
    enough for :func:`exploitability` (at most ``MAX_ENUMERATED_SQUARES`` squares), else
    None (connect four, any other env)."""
    game = board_game(env_id.partition("/")[2])
    if game is None or game.rows * game.cols > MAX_ENUMERATED_SQUARES:
        return None
    return game


@dataclass(frozen=True)
class Exploitability:
    """How a best response does against a deterministic policy, from each seat."""

    outcomes: tuple[int, int]
    """The policy's result under a best response when it moves first and second: +1 win, 0
    draw, -1 loss."""
    losing_lines: tuple[int, int]
    """Opponent move sequences, from each seat, that end in the policy's loss."""
    positions: int
    """Positions the policy was asked to move in."""

    @property
    def value(self) -> float:
        """The best response's win rate over the two seats: 0 when no seat can be beaten."""
        return sum(o == -1 for o in self.outcomes) / 2


def policy_choices(
    game: BoardGame, policy: Policy, batch: int = 4096
) -> dict[tuple[int, int], int]:
    """The action ``policy`` takes in every position where it moves that it can reach from
    either seat, whatever the other player does: ``(its pieces, the other's) -> action``.
    The policy is asked once per position, in batches of ``batch`` observations."""
    boards = Bitboards(game)
    chosen: dict[tuple[int, int], int] = {}

    def ask(positions: list[tuple[int, int]]) -> None:
        for start in range(0, len(positions), batch):
            part = positions[start : start + batch]
            obs = np.stack([observation(game, m, t) for m, t in part])
            actions = np.asarray(policy(obs)).reshape(-1)
            chosen.update({p: int(a) for p, a in zip(part, actions, strict=True)})

    # The positions where the policy moves, level by level: the empty board (it moves first)
    # and each first move of the other player (it moves second); after its move, every reply.
    frontier = [(0, 0)] + [(0, bit) for _, bit in boards.moves(0)]
    while frontier:
        new = [p for p in dict.fromkeys(frontier) if p not in chosen]
        ask(new)
        nxt: list[tuple[int, int]] = []
        for mine, theirs in new:
            after = policy_move(boards, mine, theirs, chosen[(mine, theirs)])
            if after is None or after[1]:
                continue
            me = after[0]
            for _, bit in boards.moves(me | theirs):
                them = theirs | bit
                if not boards.completes_line(them, bit) and boards.moves(me | them):
                    nxt.append((me, them))
        frontier = nxt
    return chosen


def exploitability(game: BoardGame, policy: Policy, batch: int = 4096) -> Exploitability:
    """The best response to ``policy`` (greedy actions, one per observation) by exhaustive
    search over every move of the other player, with the policy moving first and second. An
    illegal action of the policy loses at once. For games small enough to enumerate
    (tic-tac-toe); the policy is asked once per position it can reach (``policy_choices``)."""
    boards = Bitboards(game)
    chosen = policy_choices(game, policy, batch)

    def agent_value(mine: int, theirs: int) -> tuple[int, int]:
        """(the policy's result under a best response, losing lines) with the policy to
        move."""
        after = policy_move(boards, mine, theirs, chosen[(mine, theirs)])
        if after is None:
            return -1, 1
        me, done = after
        if done:
            return 1, 0
        if not boards.moves(me | theirs):
            return 0, 0
        worst, lost = 1, 0
        for _, bit in boards.moves(me | theirs):
            them = theirs | bit
            if boards.completes_line(them, bit):
                value, lines = -1, 1
            elif not boards.moves(me | them):
                value, lines = 0, 0
            else:
                value, lines = agent_value(me, them)
            worst, lost = min(worst, value), lost + lines
        return worst, lost

    first = agent_value(0, 0)
    second_worst, second_lost = 1, 0
    for _, bit in boards.moves(0):
        value, lines = agent_value(0, bit)
        second_worst, second_lost = min(second_worst, value), second_lost + lines
    return Exploitability(
        outcomes=(first[0], second_worst),
        losing_lines=(first[1], second_lost),
        positions=len(chosen),
    )


def policy_move(boards: Bitboards, mine: int, theirs: int, action: int) -> tuple[int, bool] | None:
    """The policy's pieces after its ``action`` and whether it won; None when illegal."""
    bit = dict(boards.moves(mine | theirs)).get(action)
    if bit is None:
        return None
    after = mine | bit
    return after, boards.completes_line(after, bit)


@dataclass
class BestResponse:
    """The best response to one deterministic policy, as a player: in every position the
    policy lets it reach, one of the moves that leave the policy its worst result under best
    play (chosen at random among them, so it probes every such line); in any other position
    (the policy sampled off its greedy line) the perfect player's move."""

    moves: dict[tuple[int, int], list[int]]
    """Position with the best response to move (its pieces, the policy's) -> its best actions."""
    fallback: PerfectPlayer

    def action(self, planes: np.ndarray, rng: np.random.Generator) -> int:
        """The move for the player to move of ``planes [rows, cols, 2]``."""
        best = self.moves.get(from_planes(planes))
        if best is None:
            return self.fallback.action(planes, rng)
        return best[int(rng.integers(len(best)))]


def best_response(
    game: BoardGame, policy: Policy, fallback: PerfectPlayer | None = None, batch: int = 4096
) -> BestResponse:
    """The best response to ``policy`` (greedy actions, one per observation) from both
    seats, by exhaustive search over the positions the policy can reach
    (``policy_choices``); ``fallback`` plays elsewhere (a new perfect player if None). For
    games small enough to enumerate (tic-tac-toe)."""
    boards = Bitboards(game)
    chosen = policy_choices(game, policy, batch)
    values: dict[tuple[int, int], int] = {}
    moves: dict[tuple[int, int], list[int]] = {}

    def policy_value(mine: int, theirs: int) -> int:
        """The policy's result under the best response, the policy to move."""
        after = policy_move(boards, mine, theirs, chosen[(mine, theirs)])
        if after is None:
            return -1
        if after[1]:
            return 1
        if not boards.moves(after[0] | theirs):
            return 0
        return respond(after[0], theirs)

    def respond(policy_pieces: int, own: int) -> int:
        """The policy's worst result with the best response (pieces ``own``) to move; its
        best actions go into ``moves``."""
        key = (own, policy_pieces)
        known = values.get(key)
        if known is not None:
            return known
        scored = []
        for action, bit in boards.moves(policy_pieces | own):
            after = own | bit
            if boards.completes_line(after, bit):
                value = -1
            elif not boards.moves(policy_pieces | after):
                value = 0
            else:
                value = policy_value(policy_pieces, after)
            scored.append((action, value))
        worst = min(v for _, v in scored)
        moves[key] = [a for a, v in scored if v == worst]
        values[key] = worst
        return worst

    policy_value(0, 0)  # the policy moves first
    respond(0, 0)  # the best response moves first
    return BestResponse(moves, fallback if fallback is not None else PerfectPlayer(game))
