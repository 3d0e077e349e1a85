"""Elo ratings of league members, from the results of their games."""

from __future__ import annotations

from typing import Any

from zrl.league.payoff import check_outcome


class Elo:
    """Standard Elo: a's expected score against b is 1 / (1 + 10^((Rb - Ra) / 400)); a game
    with score s (1 win, 0.5 draw, 0 loss) moves Ra by K (s - expected) and Rb by the
    opposite, so the sum of ratings stays put."""

    def __init__(self, k: float = 16.0, initial: float = 1000.0) -> None:
        self.k = k
        self.initial = initial
        self._ratings: dict[str, float] = {}

    def rating(self, name: str) -> float:
        """``name``'s rating; ``initial`` for a member without games."""
        return self._ratings.get(name, self.initial)

    def set_rating(self, name: str, rating: float) -> None:
        """Start ``name`` at ``rating`` (a snapshot inherits the rating of what it copies)."""
        self._ratings[name] = float(rating)

    def expected(self, a: str, b: str) -> float:
        """a's expected score against b."""
        return 1.0 / (1.0 + 10.0 ** ((self.rating(b) - self.rating(a)) / 400.0))

    def record(self, a: str, b: str, outcome: int) -> None:
        """One game of a against b; outcome +1 / 0 / -1 from a's side."""
        if a == b:
            raise ValueError(f"a member has no rating against itself: {a!r}")
        score = (check_outcome(outcome) + 1) / 2
        delta = self.k * (score - self.expected(a, b))
        self._ratings[a] = self.rating(a) + delta
        self._ratings[b] = self.rating(b) - delta

    def ratings(self) -> dict[str, float]:
        """Every rated member's rating (a copy)."""
        return dict(self._ratings)

    def forget(self, name: str) -> None:
        """Drop ``name``'s rating (a member that left the league)."""
        self._ratings.pop(name, None)

    def state_dict(self) -> dict[str, Any]:
        """The ratings as JSON-able data (``k`` and ``initial`` come from the config)."""
        return {"ratings": dict(self._ratings)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the ratings with those of ``state_dict()``'s output."""
        self._ratings = {str(name): float(r) for name, r in state["ratings"].items()}


__all__ = ["Elo"]
