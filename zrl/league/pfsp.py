"""Prioritized fictitious self-play (PFSP): which opponents to play, from the win rates."""

from __future__ import annotations

import numpy as np

WEIGHTINGS = ("squared", "variance", "linear", "uniform")


def pfsp_weights(win_rates: np.ndarray, weighting: str) -> np.ndarray:
    """Probabilities of picking each opponent, given the learner's win rate p against each.

    squared (1-p)^2 favours the opponents it loses to, variance p(1-p) those it is even with,
    linear 1-p is in between, uniform ignores p. When every weight is zero (say, squared and
    every p = 1) the choice is uniform."""
    p = np.asarray(win_rates, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"win_rates must be a non-empty 1-d array, got shape {p.shape}")
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"win rates must lie in [0, 1], got {p}")
    weights = _weights(p, weighting)
    total = weights.sum()
    if total <= 0:
        return np.full(p.size, 1.0 / p.size)
    return weights / total


def _weights(p: np.ndarray, weighting: str) -> np.ndarray:
    if weighting == "squared":
        return (1 - p) ** 2
    if weighting == "variance":
        return p * (1 - p)
    if weighting == "linear":
        return 1 - p
    if weighting == "uniform":
        return np.ones_like(p)
    raise ValueError(f"unknown PFSP weighting {weighting!r}; known: {', '.join(WEIGHTINGS)}")


__all__ = ["WEIGHTINGS", "pfsp_weights"]
