"""Win/draw/loss counts between league members, decayed so that old results fade."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_INDEX = {1: 0, 0: 1, -1: 2}
"""Outcome (+1 win, 0 draw, -1 loss) to its place in a pair's [wins, draws, losses]."""


def check_outcome(outcome: int) -> int:
    """``outcome`` itself when it is +1 (win), 0 (draw) or -1 (loss); ValueError otherwise."""
    if isinstance(outcome, bool) or outcome not in _INDEX:
        raise ValueError(f"outcome must be +1 (win), 0 (draw) or -1 (loss), got {outcome!r}")
    return int(outcome)


class Payoff:
    """Counts [wins, draws, losses] per ordered pair (player, opponent), from player's side.

    Each result of a pair first multiplies that pair's counts by ``decay`` and then adds one
    (AlphaStar's pseudocode), so a count is a geometrically weighted number of games and win
    rates follow a player whose strength keeps changing. A result is kept for both orders:
    (opponent, player) gets the mirrored one."""

    def __init__(self, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self._counts: dict[tuple[str, str], list[float]] = {}

    def record(self, player: str, opponent: str, outcome: int) -> None:
        """One finished game of ``player`` against ``opponent``; outcome from player's side."""
        if player == opponent:
            raise ValueError(f"a member has no payoff against itself: {player!r}")
        index = _INDEX[check_outcome(outcome)]
        self._add(player, opponent, index)
        self._add(opponent, player, 2 - index)

    def _add(self, player: str, opponent: str, index: int) -> None:
        counts = self._counts.setdefault((player, opponent), [0.0, 0.0, 0.0])
        for i in range(3):
            counts[i] *= self.decay
        counts[index] += 1.0

    def counts(self, player: str, opponent: str) -> tuple[float, float, float]:
        """(wins, draws, losses) of ``player`` against ``opponent``, decayed."""
        wins, draws, losses = self._counts.get((player, opponent), (0.0, 0.0, 0.0))
        return wins, draws, losses

    def games(self, player: str, opponent: str) -> float:
        """Decayed number of games between the two."""
        return sum(self.counts(player, opponent))

    def win_rate(self, player: str, opponent: str) -> float:
        """(wins + draws / 2) / games of ``player`` against ``opponent``; 0.5 without games."""
        wins, draws, losses = self.counts(player, opponent)
        games = wins + draws + losses
        return (wins + draws / 2) / games if games > 0 else 0.5

    def win_rates(self, player: str, opponents: Sequence[str]) -> np.ndarray:
        """``win_rate(player, o)`` for each of ``opponents``, as a float array."""
        return np.array([self.win_rate(player, o) for o in opponents], dtype=np.float64)

    def forget(self, name: str) -> None:
        """Drop every pair ``name`` is part of (a member that left the league)."""
        for pair in [pair for pair in self._counts if name in pair]:
            del self._counts[pair]

    def state_dict(self) -> dict[str, Any]:
        """The counts as JSON-able data: ``{"pairs": [[player, opponent, w, d, l], ...]}``."""
        return {"pairs": [[p, o, *counts] for (p, o), counts in self._counts.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the counts with those of ``state_dict()``'s output (``decay`` stays)."""
        counts: dict[tuple[str, str], list[float]] = {}
        for player, opponent, wins, draws, losses in state["pairs"]:
            counts[(str(player), str(opponent))] = [float(wins), float(draws), float(losses)]
        self._counts = counts


__all__ = ["Payoff", "check_outcome"]
