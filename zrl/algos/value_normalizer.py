"""Value-target normalization: the critic learns ``(v - mean) / std`` of its targets.

Sample Factory's ``normalize_returns`` (its Atari default) and rl_games' value normalization:
the value head predicts targets scaled by a running mean and standard deviation of the targets
seen so far, so the value loss has the same scale whatever the game's rewards. The learner
denormalizes the head's outputs before it bootstraps or computes advantages, updates the
statistics with each batch's (raw) targets, and regresses the head onto the normalized targets.
Unlike PopArt (van Hasselt et al. 2016) the head's last layer is not rescaled when the
statistics move; with statistics over every target seen, they move slowly after the first
batches.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor


class ValueNormalizer:
    """Running mean and variance of value targets (Chan et al.'s parallel update over batches,
    in float64), and the affine maps between raw and normalized values.

    Before the first :meth:`update` it is the identity (mean 0, std 1)."""

    def __init__(self, eps: float = 1e-5) -> None:
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got eps={eps!r}")
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # the sum of squared deviations from the mean

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 1.0

    @property
    def std(self) -> float:
        return (self.var + self.eps) ** 0.5 if self.count else 1.0

    def update(self, targets: Tensor, valid: Tensor | None = None) -> None:
        """Add the ``targets`` (any shape; only the ``valid`` entries, a bool or 0/1 tensor of
        the same shape, when given) to the statistics. NaN/inf targets raise ``ValueError``."""
        x = targets.detach()
        if valid is not None:
            if valid.shape != x.shape:
                raise ValueError(f"valid {tuple(valid.shape)} != targets {tuple(x.shape)}")
            x = x[valid.bool()]
        x = x.double().flatten()
        n = int(x.numel())
        if n == 0:
            return
        batch_mean = x.mean()
        mean, m2 = float(batch_mean), float((x - batch_mean).square().sum())
        if not (math.isfinite(mean) and math.isfinite(m2)):
            raise ValueError("value targets are not finite")
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    def normalize(self, values: Tensor) -> Tensor:
        return (values - self.mean) / self.std

    def denormalize(self, values: Tensor) -> Tensor:
        return values * self.std + self.mean

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.mean, self.m2 = (
            int(state["count"]),
            float(state["mean"]),
            float(state["m2"]),
        )
