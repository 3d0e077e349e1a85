"""Soft actor-critic math (Haarnoja et al. 2018, "SAC: Algorithms and Applications"), with the
automatic temperature and n-step, prioritized transitions.

With ``R`` the n-step return and ``discount = gamma^k`` (0 at termination) of the n-step
transitions (``zrl.codecs.nstep``), ``a' ~ pi(.|s')`` sampled from the *current* policy, and
target critics ``Q'_1, Q'_2``::

    y       = R + discount * (min(Q'_1, Q'_2)(s', a') - alpha * log pi(a'|s'))
    L_Q     = mean_b w_b * sum_i (y_b - Q_i(s_b, a_b))^2 / 2
    L_pi    = mean_b alpha * log pi(a_b|s_b) - min(Q_1, Q_2)(s_b, a_b),   a_b ~ pi(.|s_b)
    L_alpha = -mean_b log_alpha * (log pi(a_b|s_b) + H_target)           (logp detached)

With n-step returns the soft (entropy) bonus enters only at the bootstrap state ``s'``: the
``k`` intermediate rewards in ``R`` were collected by the behaviour policy and carry no entropy
term, and ``log pi`` of the intermediate actions is not stored. For ``k = 1`` this is exactly
the paper's soft Bellman backup.

``L_alpha`` is the SB3 / CleanRL form (gradient in ``log_alpha``): its gradient
``-mean(log pi + H_target)`` is negative, so ``alpha`` grows, whenever the policy's entropy
``-mean(log pi)`` is below ``H_target``, and shrinks when it is above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from zrl.algos.kernel.continuous import check_batch, frozen
from zrl.algos.kernel.optim import StepFn, checked_step
from zrl.nets.continuous import SACModel


def default_target_entropy(act_dim: int) -> float:
    """The usual heuristic ``H_target = -act_dim`` (Haarnoja et al. 2018)."""
    if isinstance(act_dim, bool) or not isinstance(act_dim, (int, np.integer)) or act_dim < 1:
        raise ValueError(f"act_dim must be an integer >= 1, got act_dim={act_dim!r}")
    return -float(act_dim)


def sac_critic_targets(
    returns: Tensor,
    discounts: Tensor,
    next_q1: Tensor,
    next_q2: Tensor,
    next_logp: Tensor,
    alpha: float | Tensor,
) -> Tensor:
    """Soft n-step target ``y = R + discount * (min(Q'_1, Q'_2) - alpha * log pi(a'|s'))``.

    The entropy bonus applies to the bootstrap state only (see the module docstring). All
    ``[B]`` -> ``[B]``; ``alpha`` a scalar.
    """
    return returns + discounts * (torch.minimum(next_q1, next_q2) - alpha * next_logp)


def sac_actor_loss(q1_pi: Tensor, q2_pi: Tensor, logp_pi: Tensor, alpha: float | Tensor) -> Tensor:
    """``mean_b alpha * log pi(a_b|s_b) - min(Q_1, Q_2)(s_b, a_b)`` for reparameterised
    ``a_b ~ pi(.|s_b)``. All ``[B]`` -> scalar."""
    return (alpha * logp_pi - torch.minimum(q1_pi, q2_pi)).mean()


def temperature_loss(log_alpha: Tensor, logp_pi: Tensor, target_entropy: float) -> Tensor:
    """``-mean_b log_alpha * (log pi(a_b|s_b) + H_target)`` with the log-probs detached, so the
    gradient only reaches ``log_alpha`` (scalar). logp_pi ``[B]`` -> scalar."""
    return -(log_alpha * (logp_pi + target_entropy).detach()).mean()


@dataclass
class SACUpdate:
    """Result of one :func:`sac_update` step."""

    critic_loss: float
    actor_loss: float
    alpha: float  # the temperature used in this step's targets and actor loss
    alpha_loss: float  # nan with a fixed alpha
    entropy: float  # -mean log pi(a|s) of the actor step's samples
    td: np.ndarray  # float32 [B] |y - Q1(s, a)|, the new replay priorities
    q_mean: float  # mean Q1(s, a) of the batch actions, before the step
    grad_norm: float = math.nan  # critic gradient L2 norm before clipping
    actor_grad_norm: float = math.nan  # actor gradient L2 norm before clipping


def sac_update(
    model: SACModel,
    target: SACModel,
    actor_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    alpha_optimizer: torch.optim.Optimizer | None,
    log_alpha: Tensor,
    batch: Mapping[str, Tensor],
    *,
    target_entropy: float,
    grad_clip: float,
    fixed_alpha: float | None = None,
    step: StepFn = checked_step,
) -> SACUpdate:
    """One SAC step: critic step, then actor step, then temperature step.

    ``batch`` holds ``obs [B, ...]``, ``action [B, A]`` (float), ``reward [B]`` (the n-step return),
    ``discount [B]``, ``next_obs [B, ...]`` and ``weight [B]``; the importance weights scale the
    critic loss. ``target`` supplies only the target critics (SAC has no target policy: ``a'`` is
    sampled from ``model.policy``). ``critic_optimizer`` holds ``q1`` and ``q2``,
    ``actor_optimizer`` the policy and ``alpha_optimizer`` the scalar ``log_alpha``. With
    ``fixed_alpha`` the temperature is that constant and ``log_alpha`` / ``alpha_optimizer`` are
    left alone. Gradients of the critic and actor are clipped to global norm ``grad_clip`` (the
    temperature's is not clipped). Each step raises :class:`NonFiniteLossError` before changing the
    weights it owns (a later non-finite loss comes after the earlier steps have been applied).
    ``step`` takes each optimizer step (a learner group's averages the gradients first). The caller
    does the Polyak target update.
    """
    check_batch(batch, grad_clip, "sac_update")
    if fixed_alpha is None:
        if alpha_optimizer is None:
            raise ValueError("sac_update: alpha_optimizer is required unless fixed_alpha is set")
        if not log_alpha.requires_grad:
            raise ValueError("sac_update: log_alpha must require grad (an nn.Parameter)")
        alpha = float(log_alpha.detach().exp().item())
    else:
        _check_alpha(fixed_alpha)
        alpha = float(fixed_alpha)
    if not math.isfinite(target_entropy):
        raise ValueError(f"target_entropy must be finite, got target_entropy={target_entropy!r}")

    obs, next_obs = batch["obs"], batch["next_obs"]
    with torch.no_grad():
        next_actions, next_logp = model.sample(next_obs)
        next_q1, next_q2 = target.q_values(next_obs, next_actions)
        y = sac_critic_targets(
            batch["reward"], batch["discount"], next_q1, next_q2, next_logp, alpha
        )

    q1, q2 = model.q_values(obs, batch["action"])
    td1 = y - q1
    weights = batch["weight"]
    critic_loss = (weights * 0.5 * td1.square()).mean() + (weights * 0.5 * (y - q2).square()).mean()
    critic_params = [*model.q1.parameters(), *model.q2.parameters()]
    grad_norm = step(critic_optimizer, critic_loss, critic_params, grad_clip)

    with frozen([model.q1, model.q2]):
        actions_pi, logp_pi = model.sample(obs)
        q1_pi, q2_pi = model.q_values(obs, actions_pi)
        actor_loss = sac_actor_loss(q1_pi, q2_pi, logp_pi, alpha)
        actor_grad_norm = step(
            actor_optimizer, actor_loss, list(model.policy.parameters()), grad_clip
        )

    alpha_loss = math.nan
    if fixed_alpha is None:
        assert alpha_optimizer is not None
        loss = temperature_loss(log_alpha, logp_pi.detach(), target_entropy)
        step(alpha_optimizer, loss, [log_alpha], math.inf)  # not clipped
        alpha_loss = float(loss.item())

    return SACUpdate(
        critic_loss=float(critic_loss.item()),
        actor_loss=float(actor_loss.item()),
        alpha=alpha,
        alpha_loss=alpha_loss,
        entropy=float(-logp_pi.detach().mean().item()),
        td=td1.detach().abs().cpu().numpy().astype(np.float32),
        q_mean=float(q1.detach().mean().item()),
        grad_norm=grad_norm,
        actor_grad_norm=actor_grad_norm,
    )


def _check_alpha(alpha: float) -> None:
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"fixed_alpha must be finite and >= 0, got fixed_alpha={alpha!r}")
