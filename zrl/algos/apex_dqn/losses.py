"""DQN / Ape-X learner math: n-step (double) Q targets, prioritized Huber loss, one update step.

Transitions are n-step: ``reward`` is ``R = sum_{i<k} gamma^i r_{t+i}`` and ``discount`` is
``gamma^k`` (0 when the episode terminated), both from
:func:`zrl.codecs.nstep.nstep_transitions`, so the targets below never need ``gamma`` or a
done flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor, nn

from zrl.algos.kernel.optim import StepFn, checked_step
from zrl.algos.kernel.q_learning import BATCH_KEYS, huber


def double_q_targets(
    returns: Tensor, discounts: Tensor, next_q_online: Tensor, next_q_target: Tensor
) -> Tensor:
    """Double-DQN target (van Hasselt et al. 2016).

    ``y = R + discount * Q_target(s', argmax_a Q_online(s', a))``: the online network picks
    the action and the target network evaluates it, which curbs max-operator overestimation.
    Shapes: returns/discounts ``[B]``, next_q_* ``[B, A]`` -> ``[B]``.
    """
    best = next_q_online.argmax(dim=1, keepdim=True)
    return returns + discounts * next_q_target.gather(1, best).squeeze(1)


def q_targets(returns: Tensor, discounts: Tensor, next_q_target: Tensor) -> Tensor:
    """Plain DQN target ``y = R + discount * max_a Q_target(s', a)``; ``[B]``."""
    return returns + discounts * next_q_target.max(dim=1).values


def td_errors(q_values: Tensor, actions: Tensor, targets: Tensor) -> Tensor:
    """TD errors ``delta = y - Q(s, a)`` for the taken actions; q_values ``[B, A]`` -> ``[B]``."""
    return targets - q_values.gather(1, actions.long().unsqueeze(1)).squeeze(1)


def dqn_loss(
    q_values: Tensor,
    actions: Tensor,
    targets: Tensor,
    weights: Tensor,
    huber_delta: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Importance-weighted Huber loss ``mean_b w_b * huber(y_b - Q(s_b, a_b))``.

    ``targets`` must be detached by the caller (computed under ``torch.no_grad()``): gradients
    flow only through ``Q(s, a)``, never into the bootstrap target. A target that requires
    grad raises ``ValueError`` instead of silently training towards a moving target.
    ``weights`` are the prioritized-replay importance weights (all ones for uniform replay).
    Returns ``(loss, td)`` with ``td = y - Q(s, a)`` detached, ``[B]``.
    """
    if targets.requires_grad:
        raise ValueError("dqn_loss: targets require grad; compute them under torch.no_grad()")
    if huber_delta <= 0:
        raise ValueError(f"huber_delta must be > 0, got huber_delta={huber_delta!r}")
    td = td_errors(q_values, actions, targets)
    loss = (weights * huber(td, huber_delta)).mean()
    return loss, td.detach()


def initial_priorities(
    q_taken: np.ndarray, returns: ArrayLike, discounts: ArrayLike, next_q: np.ndarray
) -> np.ndarray:
    """Ape-X actor-side priorities ``|R + discount * max_a next_q(s', a) - Q(s, a)|``.

    Actors compute these with their own (possibly stale) network so new data enters replay
    with a sensible priority instead of the max. Shapes: q_taken/returns/discounts ``[M]``,
    next_q ``[M, A]``. Returns float32 ``[M]``.
    """
    next_q = np.asarray(next_q, dtype=np.float64)
    target = np.asarray(returns, dtype=np.float64) + np.asarray(
        discounts, dtype=np.float64
    ) * next_q.max(axis=1)
    return np.abs(target - np.asarray(q_taken, dtype=np.float64)).astype(np.float32)


@dataclass
class DQNUpdate:
    """Result of one :func:`dqn_update` step."""

    loss: float
    td: np.ndarray  # float32 [B] |td error|, the new replay priorities
    grad_norm: float  # global L2 norm of the gradients before clipping
    q_mean: float  # mean Q(s, a) of the taken actions, before the step


def dqn_update(
    online: nn.Module,
    target: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, Tensor],
    *,
    double: bool,
    huber_delta: float,
    grad_clip: float,
    step: StepFn = checked_step,
) -> DQNUpdate:
    """One gradient step of (double) n-step DQN with prioritized-replay weights.

    ``batch`` holds ``obs [B, ...]``, ``action [B]`` (int), ``reward [B]`` (the n-step return),
    ``discount [B]`` (``gamma^k`` or 0), ``next_obs [B, ...]`` and ``weight [B]``. Gradients are
    clipped to global L2 norm ``grad_clip`` (``math.inf`` disables clipping). ``step`` takes
    the optimizer step (a learner group's averages the gradients first).
    """
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"dqn_update: batch is missing keys {missing}")
    if not grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 (math.inf disables), got grad_clip={grad_clip!r}")

    if double:
        # One forward of the online net over obs and next_obs together: on small CPU models
        # the per-call overhead dominates. next_obs only picks the argmax, so no gradient.
        n = batch["obs"].shape[0]
        q_both = online(torch.cat([batch["obs"], batch["next_obs"]]))
        q_values, next_q_online = q_both[:n], q_both[n:].detach()
    else:
        q_values = online(batch["obs"])
    with torch.no_grad():
        next_q_target = target(batch["next_obs"])
        if double:
            y = double_q_targets(batch["reward"], batch["discount"], next_q_online, next_q_target)
        else:
            y = q_targets(batch["reward"], batch["discount"], next_q_target)

    loss, td = dqn_loss(q_values, batch["action"], y, batch["weight"], huber_delta)

    grad_norm = step(optimizer, loss, list(online.parameters()), grad_clip)

    q_taken = q_values.detach().gather(1, batch["action"].long().unsqueeze(1)).mean()
    return DQNUpdate(
        loss=float(loss.item()),
        td=td.abs().cpu().numpy().astype(np.float32),
        grad_norm=grad_norm,
        q_mean=float(q_taken.item()),
    )
