"""Ape-X DDPG / TD3 learner math: n-step critic targets, target policy smoothing, one update.

Transitions are n-step (``zrl.codecs.nstep``): ``reward`` is
``R = sum_{i<k} gamma^i r_{t+i}`` and ``discount`` is ``gamma^k`` (0 when the episode
terminated). With the target actor ``mu'`` and target critics ``Q'_1, Q'_2``:

* DDPG (Lillicrap et al. 2016; distributed as in Ape-X, Horgan et al. 2018)::

      y = R + discount * Q'_1(s', mu'(s'))

* TD3 (Fujimoto et al. 2018) adds three tricks, each optional here: clipped double-Q
  ``y = R + discount * min(Q'_1, Q'_2)(s', a')``, target policy smoothing
  ``a' = clip(mu'(s') + clip(eps, -c, c), low, high)`` with ``eps ~ N(0, sigma^2)``, and delayed
  policy updates (the caller passes ``update_actor`` every ``d``-th step).

The critics minimise the importance-weighted ``mean_b w_b * L(y_b - Q_i(s_b, a_b))`` (``L`` Huber
or ``x^2 / 2``); the actor maximises ``Q_1(s, mu(s))``, i.e. minimises ``-mean_b Q_1(s_b, mu(s_b))``
(deterministic policy gradient, Silver et al. 2014), with the critic weights held fixed.
Polyak averaging of the targets is the caller's job (``zrl.algos.kernel.continuous.polyak``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from zrl.algos.kernel.continuous import check_batch, frozen
from zrl.algos.kernel.optim import StepFn, checked_step
from zrl.algos.kernel.q_learning import huber
from zrl.algos.kernel.returns import check_nonnegative
from zrl.nets.continuous import DDPGModel


def target_policy_smoothing(
    actions: Tensor,
    noise_std: float,
    noise_clip: float,
    low: Tensor | ArrayLike,
    high: Tensor | ArrayLike,
    generator: torch.Generator | None = None,
) -> Tensor:
    """TD3 target policy smoothing ``a' = clip(a + clip(eps, -c, c), low, high)``.

    Noise is given as a fraction of the half-range ``scale = (high - low) / 2``:
    ``eps = noise_std * scale * N(0, 1)`` (one ``torch.randn(actions.shape, generator=...)``
    draw) and ``c = noise_clip * scale``. ``noise_std = 0`` returns the actions clipped to the
    bounds. Shapes: actions ``[B, A]``, low/high ``[A]`` -> ``[B, A]``.
    """
    check_nonnegative("noise_std", noise_std)
    check_nonnegative("noise_clip", noise_clip)
    low_t = torch.as_tensor(low, dtype=actions.dtype, device=actions.device)
    high_t = torch.as_tensor(high, dtype=actions.dtype, device=actions.device)
    if noise_std > 0:
        scale = (high_t - low_t) / 2
        eps = torch.randn(
            actions.shape, generator=generator, dtype=actions.dtype, device=actions.device
        )
        limit = noise_clip * scale
        actions = actions + torch.clamp(noise_std * scale * eps, min=-limit, max=limit)
    return torch.clamp(actions, min=low_t, max=high_t)


def critic_targets(
    returns: Tensor, discounts: Tensor, next_q1: Tensor, next_q2: Tensor | None = None
) -> Tensor:
    """``y = R + discount * min(Q'_1, Q'_2)(s', a')`` (clipped double-Q), or
    ``R + discount * Q'_1(s', a')`` when ``next_q2`` is None. All ``[B]`` -> ``[B]``."""
    next_q = next_q1 if next_q2 is None else torch.minimum(next_q1, next_q2)
    return returns + discounts * next_q


def _critic_loss(td: Tensor, weights: Tensor, huber_delta: float | None) -> Tensor:
    """``mean_b w_b * L(td_b)`` with ``L`` Huber(``huber_delta``) or ``td^2 / 2`` if None."""
    per_sample = 0.5 * td.square() if huber_delta is None else huber(td, huber_delta)
    return (weights * per_sample).mean()


@dataclass
class DDPGUpdate:
    """Result of one :func:`ddpg_update` step."""

    critic_loss: float
    actor_loss: float  # nan when the actor was not updated this step
    td: np.ndarray  # float32 [B] |y - Q1(s, a)|, the new replay priorities
    q_mean: float  # mean Q1(s, a) of the batch actions, before the step
    grad_norm: float  # critic gradient L2 norm before clipping
    actor_grad_norm: float = math.nan  # actor gradient L2 norm before clipping (nan if no update)


def ddpg_update(
    model: DDPGModel,
    target: DDPGModel,
    actor_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    batch: Mapping[str, Tensor],
    *,
    update_actor: bool,
    target_noise: float,
    target_noise_clip: float,
    grad_clip: float,
    huber_delta: float | None,
    generator: torch.Generator | None = None,
    step: StepFn = checked_step,
) -> DDPGUpdate:
    """One Ape-X DDPG / TD3 step: critic step, then (if ``update_actor``) an actor step.

    ``batch`` holds ``obs [B, ...]``, ``action [B, A]``, ``reward [B]`` (n-step return),
    ``discount [B]`` (``gamma^k`` or 0), ``next_obs [B, ...]`` and ``weight [B]`` (importance
    weights). ``critic_optimizer`` must hold the ``q1`` (and ``q2``) parameters and
    ``actor_optimizer`` the ``policy`` parameters. Clipped double-Q is used when the model has
    ``q2`` (``twin``); ``target_noise > 0`` enables target policy smoothing (fractions of the
    half-range, see :func:`target_policy_smoothing`). Priorities are the ``q1`` TD errors.

    Each step raises :class:`NonFiniteLossError` before touching the weights it would change;
    a non-finite actor loss therefore comes after the critic has already stepped. ``step``
    takes each optimizer step (a learner group's averages the gradients first).
    """
    check_batch(batch, grad_clip, "ddpg_update")
    if huber_delta is not None and not huber_delta > 0:
        raise ValueError(f"huber_delta must be > 0 or None, got huber_delta={huber_delta!r}")
    check_nonnegative("target_noise", target_noise)
    check_nonnegative("target_noise_clip", target_noise_clip)
    if (model.q2 is None) != (target.q2 is None):
        raise ValueError(
            f"ddpg_update: model twin={model.q2 is not None} but target "
            f"twin={target.q2 is not None}"
        )

    obs, next_obs, actions = batch["obs"], batch["next_obs"], batch["action"]
    with torch.no_grad():
        next_actions = target.policy(next_obs)
        if target_noise > 0:
            next_actions = target_policy_smoothing(
                next_actions,
                target_noise,
                target_noise_clip,
                target.policy.action_low,
                target.policy.action_high,
                generator=generator,
            )
        next_q1, next_q2 = target.q_values(next_obs, next_actions)
        y = critic_targets(batch["reward"], batch["discount"], next_q1, next_q2)

    q1, q2 = model.q_values(obs, actions)
    td1 = y - q1
    critic_loss = _critic_loss(td1, batch["weight"], huber_delta)
    if q2 is not None:
        critic_loss = critic_loss + _critic_loss(y - q2, batch["weight"], huber_delta)
    critic_params = [p for m in (model.q1, model.q2) if m is not None for p in m.parameters()]
    grad_norm = step(critic_optimizer, critic_loss, critic_params, grad_clip)

    actor_loss, actor_grad_norm = math.nan, math.nan
    if update_actor:
        with frozen([model.q1, model.q2]):
            loss = -model.q1(obs, model.policy(obs)).mean()
            actor_grad_norm = step(
                actor_optimizer, loss, list(model.policy.parameters()), grad_clip
            )
        actor_loss = float(loss.item())

    return DDPGUpdate(
        critic_loss=float(critic_loss.item()),
        actor_loss=actor_loss,
        td=td1.detach().abs().cpu().numpy().astype(np.float32),
        q_mean=float(q1.detach().mean().item()),
        grad_norm=grad_norm,
        actor_grad_norm=actor_grad_norm,
    )
