"""n-step transitions cut from an ``[E, T]`` block of steps (numpy only).

Both ends of a transitions path cut the same ones: the off-policy actors (for their initial
priorities) and the replay shard that stores them (``zrl.replay.assemble``,
``zrl.replay.frames``), so they are in the codec layer below both. The return maths of the
on-policy algorithms is in ``zrl.algos.kernel.returns``. Conventions for the ``[E, T]``
arrays: row ``e`` holds steps ``t = 0..T-1`` of vector env ``e``; ``rewards[e, t]`` is the
reward of step ``t`` and ``next_obs[e, t]`` the observation after it (the final observation
when the episode ended at ``t``).

Sockets: none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass
class NStepTransitions:
    """Index form of n-step transitions cut from an ``[E, T]`` block of steps.

    The observation a transition starts from is ``obs[env, start]`` and it bootstraps from
    ``next_obs[env, end]``; the caller gathers those, so no observation is copied here.
    """

    env: np.ndarray  # int64 [M] env (row) the transition starts in
    start: np.ndarray  # int64 [M] time index t of the first step
    end: np.ndarray  # int64 [M] time index j of the last step included
    returns: np.ndarray  # float32 [M] sum_{i=0}^{k-1} gamma^i r_{t+i}, k = end - start + 1
    discounts: np.ndarray  # float32 [M] gamma^k, or 0.0 if step `end` terminated

    def __len__(self) -> int:
        return int(self.env.shape[0])


def _check_gamma(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {name}={value!r}")


def nstep_transitions(
    rewards: ArrayLike,
    terminated: ArrayLike,
    truncated: ArrayLike,
    valid: ArrayLike,
    n: int,
    gamma: float,
) -> NStepTransitions:
    """Build one n-step transition per valid step ``(e, t)``, in row-major order.

    From ``t`` it accumulates ``R = sum_{i=0}^{k-1} gamma^i r_{t+i}`` over ``k <= n`` steps,
    stopping early at the first step ``j`` that

    * terminated: ``discount = 0`` (nothing to bootstrap from),
    * truncated (time limit): ``discount = gamma^k``, bootstrap from ``next_obs[e, j]``,
    * is the last of the row (``j = T-1``) or is followed by an invalid step: the trajectory
      was cut while the episode goes on, so ``discount = gamma^k`` as well.

    The target is then ``R + discount * V(next_obs[e, end])``.

    ``valid[e, t]`` is False for steps that are not transitions (the reset-only step gymnasium's
    NEXT_STEP autoreset inserts after an episode end). Those only ever follow an episode end,
    where accumulation stops anyway; treating them as a cut also keeps padded rows correct.
    """
    rew = np.asarray(rewards, dtype=np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    val = np.asarray(valid, dtype=bool)
    if rew.ndim != 2:
        raise ValueError(f"rewards must be [E, T], got shape {rew.shape}")
    for name, arr in (("terminated", term), ("truncated", trunc), ("valid", val)):
        if arr.shape != rew.shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {rew.shape} like rewards")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got n={n!r}")
    _check_gamma("gamma", gamma)

    num_envs, horizon = rew.shape
    # A step j stops accumulation if the episode ended there or the next step is not part of
    # the same trajectory (end of the row, or an invalid step).
    next_valid = np.zeros_like(val)
    next_valid[:, :-1] = val[:, 1:]
    stops = term | trunc | ~next_valid

    env_idx, start = np.nonzero(val)  # row-major, as required
    ret = np.zeros(start.shape, dtype=np.float64)
    end = start.copy()
    active = np.ones(start.shape, dtype=bool)  # still accumulating
    for k in range(min(int(n), horizon)):
        j = start + k
        # Inactive transitions may index past the row; clip so the gather stays in bounds.
        j_safe = np.minimum(j, horizon - 1)
        ret += np.where(active, gamma**k * rew[env_idx, j_safe], 0.0)
        end = np.where(active, j_safe, end)
        active &= ~stops[env_idx, j_safe]
        if not active.any():
            break

    k_steps = end - start + 1
    discounts = np.where(term[env_idx, end], 0.0, np.float64(gamma) ** k_steps)
    return NStepTransitions(
        env=env_idx.astype(np.int64),
        start=start.astype(np.int64),
        end=end.astype(np.int64),
        returns=ret.astype(np.float32),
        discounts=discounts.astype(np.float32),
    )
