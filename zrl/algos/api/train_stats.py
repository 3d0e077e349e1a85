"""``TrainStats``: cheap running means of a role's training figures between two metrics reports.

A role adds what its update already computed (Python floats, numpy scalars, or 0-d torch
tensors that have not been read yet) after every update; :meth:`TrainStats.flush` reduces them
once a second, when the role publishes its metrics, and starts afresh. Tensors are kept as
they are until then, so the update loop pays for no ``.item()`` it did not already do.

Every key reports its mean; keys added with ``add_with_max`` also report ``<key>_max``.
Non-finite values (an actor loss on a step without an actor update, say) are skipped.
"""

from __future__ import annotations

import math
from typing import Any

# Metric names travel on the open topic bus and become TensorBoard tags: short snake_case.
MAX_KEYS = 64


class TrainStats:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._sum: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._max: dict[str, float] = {}
        self._tensors: dict[str, list[Any]] = {}
        self._extrema: set[str] = set()

    def add(self, **values: Any) -> None:
        """Accumulate one value per key (None and non-finite floats are skipped)."""
        self._add(values, extrema=False)

    def add_with_max(self, **values: Any) -> None:
        """As ``add``; the report also holds each key's largest value as ``<key>_max``."""
        self._add(values, extrema=True)

    def _add(self, values: dict[str, Any], extrema: bool) -> None:
        for key, value in values.items():
            if value is None:
                continue
            if extrema:
                self._extrema.add(key)
            if hasattr(value, "detach"):  # a torch tensor: reduced at flush time
                self._tensors.setdefault(key, []).append(value.detach())
                continue
            v = float(value)
            if not math.isfinite(v):
                continue
            self._sum[key] = self._sum.get(key, 0.0) + v
            self._count[key] = self._count.get(key, 0) + 1
            if extrema:
                self._max[key] = max(self._max.get(key, -math.inf), v)

    def add_array(self, key: str, values: Any) -> None:
        """Mean and max of a numpy array (one batch's |TD errors|, say) as one observation each."""
        if len(values) == 0:
            return
        self.add(**{key: float(values.mean())})
        self._max[key] = max(self._max.get(key, -math.inf), float(values.max()))
        self._extrema.add(key)

    def __len__(self) -> int:
        return len(self._count) + len(self._tensors)

    def flush(self) -> dict[str, float]:
        """The means (and maxima) since the last flush; then start afresh."""
        for key, tensors in self._tensors.items():
            import torch

            flat = torch.stack([t.reshape(()).double() for t in tensors])
            flat = flat[torch.isfinite(flat)]
            if len(flat) == 0:
                continue
            self._sum[key] = self._sum.get(key, 0.0) + float(flat.sum())
            self._count[key] = self._count.get(key, 0) + len(flat)
            if key in self._extrema:
                self._max[key] = max(self._max.get(key, -math.inf), float(flat.max()))
        out: dict[str, float] = {}
        for key in list(self._count)[:MAX_KEYS]:
            out[key] = self._sum[key] / self._count[key]
            if key in self._extrema and math.isfinite(self._max.get(key, math.nan)):
                out[f"{key}_max"] = self._max[key]
        self._reset()
        return out
