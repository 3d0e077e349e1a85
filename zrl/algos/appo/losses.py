"""APPO learner math: PPO's clipped surrogate on V-trace advantages.

APPO is Sample Factory's flagship algorithm (Petrenko et al. 2020, "Sample Factory: Egocentric
3D Control from Pixels at 100000 FPS with Asynchronous Reinforcement Learning", Sec. 3.3) and
RLlib's ``APPO``: IMPALA's asynchronous actors, and a learner that optimizes PPO's objective
(Schulman et al. 2017) where the advantages and value targets come from V-trace (Espeholt et al.
2018). On one minibatch of whole unrolls, time-major ``[T, B]``, with ``mu`` the actors'
(behaviour) policy and ``pi`` the learner's current one:

1. V-trace targets ``v_s`` under the current ``pi`` and ``V`` (``zrl.algos.kernel.vtrace.vtrace``,
   recomputed for every minibatch, as Sample Factory does, so later epochs correct for the
   policy having moved), and the V-trace policy-gradient advantage::

       A_t = min(rho_bar, pi_t / mu_t) * (r_t + gamma_t * v_{t+1} - V(x_t))       v_T = V(x_T)

2. The clipped surrogate against the behaviour policy (RLlib APPO's and Sample Factory's
   ``ratio = exp(logp - behaviour_logp)``), optionally on advantages normalized over the
   minibatch's valid steps::

       ratio_t     = pi(a_t|x_t) / mu(a_t|x_t)
       policy_loss = -mean_t min(ratio_t * A_t, clamp(ratio_t, 1 - clip, 1 + clip) * A_t)

   Sample Factory clips to ``[1 / (1 + clip), 1 + clip]``; zrl keeps PPO's symmetric clip, so
   on-policy (``mu == pi``, ``rho_bar, c_bar >= 1``), where ``v_s`` is the n-step return, this
   is exactly PPO's loss (``zrl.algos.kernel.policy_gradient.ppo_loss``) with n-step advantages.
   RLlib's extra importance factor against a target network is not used.

3. ``value_loss = 0.5 * mean (v_t - V(x_t))^2`` (PPO2-clipped against the values before the
   batch's first step when ``value_clip`` is set), the entropy bonus, and
   ``loss = policy_loss + value_coef * value_loss - entropy_coef * mean H(pi(.|x_t))``.

Every mean is over the valid steps (``valid [T, B]``; the autoreset steps carry no transition).
"""

from __future__ import annotations

import torch
from torch import Tensor

from zrl.algos.kernel.returns import check_nonnegative
from zrl.algos.kernel.vtrace import VTraceReturns, check_loss_inputs
from zrl.nets.gaussian import CATEGORICAL, ActionDistribution


def masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    """The mean of ``x`` over the ``valid`` (bool, same shape) entries; 0 when there is none.

    ``where``, not a product: an entry outside the mask may be inf, and inf * 0 is NaN."""
    total = torch.where(valid, x, torch.zeros_like(x)).sum()
    return total / valid.sum().clamp(min=1)


def masked_normalize(x: Tensor, valid: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` with the mean and unbiased std of the ``valid`` entries (as
    ``zrl.algos.kernel.policy_gradient.normalize`` of ``x[valid]``); ``x`` as is with fewer than two
    valid entries. No host sync: fit for a batch on an accelerator."""
    n = valid.sum()
    mean = masked_mean(x, valid)
    centred = torch.where(valid, x - mean, torch.zeros_like(x))
    std = (centred.square().sum() / (n - 1).clamp(min=1)).sqrt()
    return torch.where(n > 1, (x - mean) / (std + eps), x)


def appo_loss(
    logits: Tensor,
    values: Tensor,
    actions: Tensor,
    behaviour_logp: Tensor,
    vtrace_returns: VTraceReturns,
    *,
    clip: float,
    entropy_coef: float,
    value_coef: float,
    value_clip: float | None = None,
    old_values: Tensor | None = None,
    normalize_advantages: bool = True,
    valid: Tensor | None = None,
    distribution: ActionDistribution = CATEGORICAL,
) -> tuple[Tensor, dict[str, Tensor]]:
    """APPO's loss on one minibatch (see the module docstring), averaged over its valid steps.

    ``logits [T, B, A]`` and ``values [T, B]`` come from the learner's forward pass (with
    gradients); ``actions``, ``behaviour_logp`` (``log mu(a_t|x_t)``) and ``valid`` are ``[T,
    B]``; ``vtrace_returns`` (``vs`` and ``pg_advantages`` ``[T, B]``) are constants from
    :func:`zrl.algos.kernel.vtrace.vtrace`. ``old_values [T, B]`` (constants) are required with
    ``value_clip``. ``distribution`` reads the logits: categorical, or
    :data:`zrl.nets.gaussian.DIAG_GAUSSIAN` (``logits [T, B, 2A]`` the mean and log-std,
    ``actions [T, B, A]``; log-densities and entropies summed over the action dims). Returns
    ``(loss, parts)``, the parts detached 0-d tensors on the inputs' device: ``loss,
    policy_loss, value_loss, entropy, approx_kl`` (``mean((r - 1) - log r)``, an estimate of
    ``KL(mu || pi)``), ``clip_fraction`` and ``mean_rho`` (mean ``pi / mu``).
    """
    check_loss_inputs(
        "appo_loss",
        logits,
        vtrace_returns,
        values=values,
        actions=actions,
        behaviour_logp=behaviour_logp,
        valid=valid,
        old_values=old_values,
    )
    vs, pg_adv = vtrace_returns.vs, vtrace_returns.pg_advantages
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got clip={clip!r}")
    if value_clip is not None and not value_clip > 0:
        raise ValueError(f"value_clip must be > 0 or None, got value_clip={value_clip!r}")
    if value_clip is not None and old_values is None:
        raise ValueError("appo_loss: value_clip needs old_values")
    check_nonnegative("entropy_coef", entropy_coef)
    check_nonnegative("value_coef", value_coef)
    mask = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()

    # The ratio pi / mu of the taken actions, with gradients through pi. Set to 1 on invalid
    # steps, where mu is anything: an overflow there would put NaN into the gradients.
    new_logp = distribution.log_prob(logits, actions)
    log_ratio = torch.where(mask, new_logp - behaviour_logp, torch.zeros_like(new_logp))
    ratio = log_ratio.exp()

    # The clipped surrogate on the V-trace advantages (pessimistic: the min of the two).
    adv = masked_normalize(pg_adv, mask) if normalize_advantages else pg_adv
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    policy_loss = -masked_mean(surrogate, mask)

    # The value regression to the V-trace targets, optionally PPO2-clipped.
    value_err = (values - vs).square()
    if value_clip is not None:
        assert old_values is not None
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        value_err = torch.max(value_err, (clipped - vs).square())
    value_loss = 0.5 * masked_mean(value_err, mask)

    entropy = masked_mean(distribution.entropy(logits), mask)
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy

    with torch.no_grad():
        parts = {
            "loss": loss.detach(),
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "clip_fraction": masked_mean(((ratio - 1.0).abs() > clip).to(ratio.dtype), mask),
            "mean_rho": masked_mean(ratio, mask),
        }
    return loss, parts
