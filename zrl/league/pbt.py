"""Population-based training's rule (Jaderberg et al. 2017), as pure functions: which members
exploit which (``exploit_pairs``) and how a copied hyperparameter is explored (``explore``).

No torch, no sockets: the ``pbt`` role (``zrl.roles.pbt``) gathers the fitness and sends the
instructions; these decide them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence


def exploit_pairs(
    fitness: Mapping[str, float], fraction: float, rng: random.Random
) -> list[tuple[str, str]]:
    """``(worse, better)`` pairs: the members ranked by ``fitness`` (best first; ties by
    name), ``k = max(1, floor(fraction * n))`` of them at each end; each of the bottom ``k``
    copies one of the top ``k`` drawn uniformly. Fewer than two ranked members: none."""
    ranked = sorted(fitness, key=lambda m: (-fitness[m], m))
    n = len(ranked)
    if n < 2:
        return []
    k = max(1, min(n // 2, math.floor(fraction * n)))
    top, bottom = ranked[:k], ranked[n - k :]
    return [(worse, rng.choice(top)) for worse in bottom]


def explore(
    values: Mapping[str, float],
    bounds: Mapping[str, tuple[float, float]],
    perturb: Sequence[float],
    resample_probability: float,
    rng: random.Random,
) -> dict[str, float]:
    """New hyperparameters from ``values`` (the better member's), one per key of ``bounds``:
    with ``resample_probability`` drawn log-uniformly in ``[low, high]``, else multiplied by
    one of ``perturb`` drawn uniformly; clipped to ``[low, high]`` either way."""
    out: dict[str, float] = {}
    for name, (low, high) in bounds.items():
        if rng.random() < resample_probability:
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            value = values[name] * rng.choice(list(perturb))
        out[name] = min(high, max(low, value))
    return out
