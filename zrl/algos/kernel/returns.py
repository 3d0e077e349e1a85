"""Return computations shared by the algorithms (numpy only).

Conventions for the ``[E, T]`` arrays: row ``e`` holds steps ``t = 0..T-1`` of vector env ``e``;
``rewards[e, t]`` is the reward of step ``t`` and ``next_obs[e, t]`` the observation after it
(the final observation when the episode ended at ``t``).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike


def check_nonnegative(name: str, value: float) -> None:
    """ValueError naming ``name`` unless ``value`` is finite and >= 0 (a loss coefficient, a
    noise scale)."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {name}={value!r}")


def _check_gamma(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {name}={value!r}")


def _check_time_major(
    rewards: np.ndarray, others: dict[str, np.ndarray], bootstrap: np.ndarray
) -> None:
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards must be [T] or [E, T], got shape {rewards.shape}")
    for name, arr in others.items():
        if arr.shape != rewards.shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {rewards.shape} like rewards")
    if bootstrap.shape != rewards.shape[:-1]:
        raise ValueError(
            f"bootstrap_value has shape {bootstrap.shape}, expected {rewards.shape[:-1]} "
            f"(rewards.shape without the time axis)"
        )


def discounted_returns(
    rewards: ArrayLike, dones: ArrayLike, bootstrap_value: ArrayLike | float, gamma: float
) -> np.ndarray:
    """Discounted returns along the last (time) axis of ``[T]`` or ``[E, T]`` arrays.

    ``G_t = r_t + gamma * (1 - d_t) * G_{t+1}`` with ``G_T = bootstrap_value`` (``[]`` or ``[E]``),
    i.e. ``dones[t]`` means the episode ended at step ``t`` and nothing is bootstrapped past it.
    A truncated episode's bootstrap ``gamma * V(final_obs)`` must be folded into its reward
    by the caller. Returns float32 of the same shape as ``rewards``.
    """
    rew = np.asarray(rewards, dtype=np.float64)
    not_done = 1.0 - np.asarray(dones, dtype=bool)
    boot = np.asarray(bootstrap_value, dtype=np.float64)
    _check_time_major(rew, {"dones": not_done}, boot)
    _check_gamma("gamma", gamma)

    out = np.empty_like(rew)
    running = boot
    for t in reversed(range(rew.shape[-1])):
        running = rew[..., t] + gamma * not_done[..., t] * running
        out[..., t] = running
    return out.astype(np.float32)


def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    dones: ArrayLike,
    bootstrap_value: ArrayLike | float,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016) along the last axis.

    ``delta_t = r_t + gamma * (1 - d_t) * V_{t+1} - V_t`` with ``V_T = bootstrap_value``,
    ``A_t = delta_t + gamma * lam * (1 - d_t) * A_{t+1}`` with ``A_T = 0``, and the value
    targets are ``returns_t = A_t + V_t``. ``dones[t]`` means the episode ended at step ``t``
    (same convention as :func:`discounted_returns`). Shapes ``[E, T]`` (or ``[T]``), the
    bootstrap ``[E]`` (or a scalar). Returns float32 ``(advantages, returns)``.
    """
    rew = np.asarray(rewards, dtype=np.float64)
    val = np.asarray(values, dtype=np.float64)
    not_done = 1.0 - np.asarray(dones, dtype=bool)
    boot = np.asarray(bootstrap_value, dtype=np.float64)
    _check_time_major(rew, {"values": val, "dones": not_done}, boot)
    return _gae_scan(rew, val, boot, not_done, not_done, None, gamma, lam)


def rollout_gae(
    rewards: ArrayLike,
    values: ArrayLike,
    terminated: ArrayLike,
    truncated: ArrayLike,
    valid: ArrayLike,
    bootstrap_value: ArrayLike,
    gamma: float,
    lam: float,
    passes: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE over a rollout of NEXT_STEP-autoreset vector envs, ``[E, T]`` (time last).

    Step ``t`` acts on ``obs[t]`` and ``values[t] = V(obs[t])``; the observation after it is
    ``obs[t + 1]`` (``bootstrap_value`` after the last step). After an episode ends at ``t``,
    step ``t + 1`` only resets that env: it is invalid (``valid[t + 1]`` False), but its
    observation is the episode's final one, so ``values[t + 1]`` is exactly the bootstrap a
    *truncated* episode needs. Hence::

        delta_t = r_t + gamma * (1 - terminated_t) * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * (1 - terminated_t) * (1 - truncated_t) * A_{t+1}

    with ``A = 0`` (and returns ``= V``) on invalid steps. Returns float32 ``(advantages,
    returns)``, ``returns = A + V``.

    ``passes[e, t]`` (a two-player zero-sum game whose slot plays both seats): after step
    ``t`` the other player is to move, so the values of the steps after it are that
    player's, and they enter negated (negamax): ``V_{t+1}`` and ``A_{t+1}`` above are
    multiplied by -1 where ``passes_t``.
    """
    rew = np.asarray(rewards, dtype=np.float64)
    val = np.asarray(values, dtype=np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    ok = np.asarray(valid, dtype=bool)
    boot = np.asarray(bootstrap_value, dtype=np.float64)
    arrays = {"values": val, "terminated": term, "truncated": trunc, "valid": ok}
    sign: np.ndarray | float = 1.0
    if passes is not None:
        turns = np.asarray(passes, dtype=bool)
        arrays["passes"] = turns
        sign = np.where(turns, -1.0, 1.0)
    _check_time_major(rew, arrays, boot)
    return _gae_scan(
        rew, val, boot, sign * (1.0 - term), sign * (1.0 - (term | trunc)), ok, gamma, lam
    )


def _gae_scan(
    rew: np.ndarray,
    val: np.ndarray,
    boot: np.ndarray,
    bootstraps: np.ndarray,
    continues: np.ndarray,
    valid: np.ndarray | None,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The backward GAE recursion of :func:`gae` and :func:`rollout_gae` over checked
    float64 arrays: ``delta_t = r_t + gamma * bootstraps_t * V_{t+1} - V_t`` and
    ``A_t = delta_t + gamma * lam * continues_t * A_{t+1}`` (0 where ``valid`` is False)."""
    _check_gamma("gamma", gamma)
    _check_gamma("lam", lam)
    advantages = np.zeros_like(rew)
    next_value = boot
    running = np.zeros_like(boot)
    for t in reversed(range(rew.shape[-1])):
        delta = rew[..., t] + gamma * bootstraps[..., t] * next_value - val[..., t]
        running = delta + gamma * lam * continues[..., t] * running
        if valid is not None:
            running = np.where(valid[..., t], running, 0.0)
        advantages[..., t] = running
        next_value = val[..., t]
    return advantages.astype(np.float32), (advantages + val).astype(np.float32)
