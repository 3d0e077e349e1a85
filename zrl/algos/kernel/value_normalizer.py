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

import torch
from torch import Tensor


class ValueNormalizer:
    """Running mean and variance of value targets (Chan et al.'s parallel update over batches,
    in float64), and the affine maps between raw and normalized values.

    Before the first :meth:`update` it is the identity (mean 0, std 1). Targets on the CPU
    update Python floats, checked at once; targets on a GPU are folded in there
    (:meth:`fold`), nothing read back: the statistics then live on that device, and
    ``count``, ``mean``, ``std`` read them (the metrics report's once a second)."""

    def __init__(self, eps: float = 1e-5) -> None:
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got eps={eps!r}")
        self.eps = eps
        self._count = 0
        self._mean = 0.0
        self._m2 = 0.0  # the sum of squared deviations from the mean
        self._on_device: Tensor | None = None
        """``[count, mean, m2]`` (float64) once :meth:`fold` took targets: the statistics."""

    @property
    def count(self) -> int:
        return self._count if self._on_device is None else int(self._on_device[0])

    @property
    def mean(self) -> float:
        return self._mean if self._on_device is None else float(self._on_device[1])

    @property
    def m2(self) -> float:
        return self._m2 if self._on_device is None else float(self._on_device[2])

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 1.0

    @property
    def std(self) -> float:
        return (self.var + self.eps) ** 0.5 if self.count else 1.0

    def update(self, targets: Tensor, valid: Tensor | None = None) -> None:
        """Add the ``targets`` (any shape; only the ``valid`` entries, a bool or 0/1 tensor of
        the same shape, when given) to the statistics. NaN/inf targets raise ``ValueError``
        (on the CPU; on a GPU see :meth:`fold`)."""
        x = targets.detach()
        if valid is not None and valid.shape != x.shape:
            raise ValueError(f"valid {tuple(valid.shape)} != targets {tuple(x.shape)}")
        if x.device.type != "cpu" or self._on_device is not None:
            self.fold(x, valid)
            return
        if valid is not None:
            x = x[valid.bool()]
        x = x.double().flatten()
        n = int(x.numel())
        if n == 0:
            return
        batch_mean = x.mean()
        mean, m2 = float(batch_mean), float((x - batch_mean).square().sum())
        if not (math.isfinite(mean) and math.isfinite(m2)):
            raise ValueError("value targets are not finite")
        total = self._count + n
        delta = mean - self._mean
        self._mean += delta * n / total
        self._m2 += m2 + delta * delta * self._count * n / total
        self._count = total

    def fold(self, targets: Tensor, valid: Tensor | None = None) -> None:
        """:meth:`update` without reading anything back to the host (a GPU learner's): the
        statistics become float64 tensors on the targets' device. Non-finite targets leave
        them as they were, unreported: the loss they feed is non-finite too, and its step
        is skipped (``zrl.algos.kernel.optim.deferred_step``)."""
        x = targets.detach().double()
        if valid is not None and valid.shape != x.shape:
            raise ValueError(f"valid {tuple(valid.shape)} != targets {tuple(x.shape)}")
        w = torch.ones_like(x) if valid is None else valid.to(torch.float64)
        if self._on_device is not None:  # where the statistics are
            x, w = x.to(self._on_device.device), w.to(self._on_device.device)
        x = torch.where(w > 0, x, torch.zeros_like(x))
        if self._on_device is None:
            stats = [float(self._count), self._mean, self._m2]
            self._on_device = torch.tensor(stats, dtype=torch.float64, device=x.device)
        count, mean, m2 = self._on_device.unbind()
        n = w.sum()
        batch_mean = x.sum() / n.clamp(min=1)
        batch_m2 = ((x - batch_mean).square() * w).sum()
        total = count + n
        delta = batch_mean - mean
        share = n / total.clamp(min=1)
        new = torch.stack(
            [total, mean + delta * share, m2 + batch_m2 + delta.square() * count * share]
        )
        keep = (n > 0) & torch.isfinite(batch_mean) & torch.isfinite(batch_m2)
        self._on_device = torch.where(keep, new, self._on_device)

    def _affine(self, values: Tensor) -> tuple[float | Tensor, float | Tensor]:
        """``(mean, std)`` for maps of ``values``: floats, or 0-d tensors of ``values``'
        dtype where the statistics are on the device."""
        if self._on_device is None:
            return self._mean, self.std
        count, mean, m2 = self._on_device.unbind()
        var = torch.where(count > 0, m2 / count.clamp(min=1) + self.eps, torch.ones_like(m2))
        return mean.to(values.dtype), var.sqrt().to(values.dtype)

    def normalize(self, values: Tensor) -> Tensor:
        mean, std = self._affine(values)
        return (values - mean) / std

    def denormalize(self, values: Tensor) -> Tensor:
        mean, std = self._affine(values)
        return values * std + mean

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._count, self._mean, self._m2 = (
            int(state["count"]),
            float(state["mean"]),
            float(state["m2"]),
        )
        self._on_device = None  # folded in again from these at the next batch on a GPU
