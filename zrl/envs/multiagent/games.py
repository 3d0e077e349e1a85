"""Scripted players of the k-in-a-row board games (PettingZoo classic tic-tac-toe and connect
four), written on the observation an agent gets: planes ``[rows, cols, 2]``, plane 0 the
pieces of the player to move, plane 1 the other player's.

The scripted player searches two plies: it wins at once when it can, blocks a square where
the other player would win next, and (with gravity) avoids a move that opens the square above
it to the other player's win. Among the moves left it prefers the squares the most lines of k
pass through (the centre, then corners in tic-tac-toe), ties broken at random. It is the
yardstick for "loses at most 5% against a scripted opponent".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))
"""A line's direction: along a row, down a column, and the two diagonals."""


@dataclass(frozen=True)
class BoardGame:
    rows: int
    cols: int
    k: int
    """Pieces in a line (row, column or diagonal) that win."""
    gravity: bool
    """An action names a column and the piece drops to its lowest empty square (connect
    four); otherwise an action names a square, ``row * cols + col``."""

    @property
    def num_actions(self) -> int:
        return self.cols if self.gravity else self.rows * self.cols

    def square(self, board: np.ndarray, action: int) -> tuple[int, int] | None:
        """Where ``action`` puts a piece on ``board`` (occupied ``[rows, cols]`` bool), or None
        when it is illegal."""
        if self.gravity:
            empty = np.flatnonzero(~board[:, action])
            return None if len(empty) == 0 else (int(empty[-1]), action)
        r, c = divmod(action, self.cols)
        return None if board[r, c] else (r, c)

    def wins(self, pieces: np.ndarray, r: int, c: int) -> bool:
        """Whether a piece at (r, c) completes a line of k in ``pieces`` (bool board)."""
        for dr, dc in DIRECTIONS:
            run = 1
            for sign in (1, -1):
                rr, cc = r + sign * dr, c + sign * dc
                while 0 <= rr < self.rows and 0 <= cc < self.cols and pieces[rr, cc]:
                    run += 1
                    rr, cc = rr + sign * dr, cc + sign * dc
            if run >= self.k:
                return True
        return False

    def winning_actions(self, pieces: np.ndarray, occupied: np.ndarray) -> list[int]:
        """Actions after which ``pieces`` hold a line of k."""
        out = []
        for a in range(self.num_actions):
            sq = self.square(occupied, a)
            if sq is not None and self.wins(pieces, *sq):
                out.append(a)
        return out

    @cached_property
    def lines(self) -> np.ndarray:
        """``[rows, cols]``: how many lines of k squares pass through each square (more for
        central squares; tic-tac-toe: 4 for the centre, 3 for a corner, 2 for an edge)."""
        return np.array(
            [[self._count_lines(r, c) for c in range(self.cols)] for r in range(self.rows)]
        )

    def _count_lines(self, r: int, c: int) -> int:
        count = 0
        for dr, dc in DIRECTIONS:
            for shift in range(self.k):
                r0, c0 = r - shift * dr, c - shift * dc
                r1, c1 = r0 + (self.k - 1) * dr, c0 + (self.k - 1) * dc
                if all(0 <= x < self.rows for x in (r0, r1)) and all(
                    0 <= y < self.cols for y in (c0, c1)
                ):
                    count += 1
        return count

    def scripted_action(
        self, planes: np.ndarray, mask: np.ndarray, rng: np.random.Generator
    ) -> int:
        """The scripted player's move for the player to move of ``planes [rows, cols, 2]``
        with legal ``mask [num_actions]``."""
        mine, theirs = planes[..., 0] > 0, planes[..., 1] > 0
        occupied = mine | theirs
        legal = [int(a) for a in np.flatnonzero(mask)]
        win = [a for a in self.winning_actions(mine, occupied) if a in legal]
        if win:
            return win[int(rng.integers(len(win)))]
        block = [a for a in self.winning_actions(theirs, occupied) if a in legal]
        if block:
            return block[int(rng.integers(len(block)))]
        safe = [a for a in legal if not self._opens_win(a, theirs, occupied)] or legal
        lines = {a: int(self.lines[self._square(occupied, a)]) for a in safe}
        best = max(lines.values())
        central = [a for a in safe if lines[a] == best]
        return central[int(rng.integers(len(central)))]

    def _square(self, occupied: np.ndarray, action: int) -> tuple[int, int]:
        sq = self.square(occupied, action)
        assert sq is not None, f"illegal action {action}"
        return sq

    def _opens_win(self, action: int, theirs: np.ndarray, occupied: np.ndarray) -> bool:
        """Whether after ``action`` the other player can win at once (only gravity games
        have squares that a move makes playable)."""
        if not self.gravity:
            return False
        after = occupied.copy()
        after[self._square(occupied, action)] = True
        return bool(self.winning_actions(theirs, after))


GAMES: dict[str, BoardGame] = {
    "tictactoe": BoardGame(rows=3, cols=3, k=3, gravity=False),
    "connect_four": BoardGame(rows=6, cols=7, k=4, gravity=True),
}


def board_game(env_name: str) -> BoardGame | None:
    """The board game of a PettingZoo env name (``tictactoe_v3`` -> tic-tac-toe), or None for
    one without a scripted player."""
    return GAMES.get(env_name.rsplit("_v", 1)[0])
