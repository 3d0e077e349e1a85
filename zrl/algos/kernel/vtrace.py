"""V-trace off-policy targets (IMPALA, Espeholt et al. 2018) and the learner's forward pass
over a batch of unrolls that computes them (:func:`unroll_forward`): what IMPALA's loss
(``zrl.algos.impala.losses``) and APPO's (``zrl.algos.appo.losses``) train on.

All ``[T, B]`` tensors are time-major: ``x[t, b]`` is step ``t`` of trajectory ``b``. Row ``t``
of ``rewards`` / ``discounts`` belongs to the transition ``x_t -> x_{t+1}`` and
``discounts[t] = gamma * (1 - done_t)``, so nothing is bootstrapped across an episode end.
``bootstrap_value [B]`` is ``V(x_T)``, the value of the observation after the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zrl.algos.kernel.unrolls import unroll_outputs
from zrl.algos.kernel.value_normalizer import ValueNormalizer
from zrl.nets.gaussian import CATEGORICAL, ActionDistribution, distribution_of


@dataclass
class VTraceReturns:
    """Output of :func:`vtrace`; both ``[T, B]`` and detached."""

    vs: Tensor  # value targets v_s
    pg_advantages: Tensor  # rho^pg_s * (r_s + gamma_s * v_{s+1} - V(x_s))


def _check_threshold(name: str, value: float) -> None:
    # `not value > 0` also rejects NaN; math.inf (no clipping) is allowed.
    if not value > 0:
        raise ValueError(f"{name} must be > 0 (math.inf disables clipping), got {name}={value!r}")


def vtrace(
    behaviour_logp: Tensor,
    target_logp: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    valid: Tensor | None = None,
    *,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages (IMPALA, Espeholt et al. 2018, Sec. 4).

    With the importance ratio ``ratio_t = pi(a_t|x_t) / mu(a_t|x_t) = exp(target_logp -
    behaviour_logp)`` of the learner policy ``pi`` over the actor policy ``mu``::

        rho_t   = min(rho_bar, ratio_t)        c_t = min(c_bar, ratio_t)
        delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))        V(x_T) = bootstrap_value
        v_s     = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) * delta_t

    (with a constant ``gamma`` the product is the paper's ``gamma^{t-s} prod c_i``), computed
    by the backward recursion ``v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))``.
    ``lambda_ < 1`` scales the traces, ``c_t = lambda_ * min(c_bar, ratio_t)`` (as rlax's
    ``vtrace(lambda_=...)``): on-policy ``v_s`` is then the lambda-return, as in GAE.
    The policy-gradient advantage is

        A_s = min(pg_rho_bar, ratio_s) * (r_s + gamma_s * v_{s+1} - V(x_s))      v_T = V(x_T)

    with ``pg_rho_bar = rho_bar`` when None. On-policy (``pi == mu``) with ``rho_bar, c_bar >=
    1`` the targets are the n-step bootstrapped returns.

    ``valid [T, B]`` (optional) marks the steps that are real transitions. On an invalid step
    (an autoreset step after an episode end) ``delta`` and the advantage are 0; with its
    ``discounts`` 0 too, ``v_s = V(x_s)`` there, so a truncated episode bootstraps from the value
    of its final observation and nothing flows across the reset. Everything runs under
    ``torch.no_grad()`` in the inputs' dtype; shapes ``[T, B]``, ``bootstrap_value [B]``.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [T, B], got shape {tuple(rewards.shape)}")
    for name, arr in (
        ("behaviour_logp", behaviour_logp),
        ("target_logp", target_logp),
        ("discounts", discounts),
        ("values", values),
    ):
        if arr.shape != rewards.shape:
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}, expected {tuple(rewards.shape)} like rewards"
            )
    if valid is not None and valid.shape != rewards.shape:
        raise ValueError(
            f"valid has shape {tuple(valid.shape)}, expected {tuple(rewards.shape)} like rewards"
        )
    if bootstrap_value.shape != rewards.shape[1:]:
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected "
            f"{tuple(rewards.shape[1:])} (rewards.shape without the time axis)"
        )
    _check_threshold("rho_bar", rho_bar)
    _check_threshold("c_bar", c_bar)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got lambda_={lambda_!r}")
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    _check_threshold("pg_rho_bar", pg_rho_bar)

    with torch.no_grad():
        ratios = torch.exp(target_logp - behaviour_logp)
        # clamp(max=inf) is a no-op, so math.inf means "no clipping".
        rhos = ratios.clamp(max=rho_bar)
        cs = lambda_ * ratios.clamp(max=c_bar)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = rhos * (rewards + discounts * next_values - values)
        if valid is not None:
            # where, not a product: an invalid step's ratio may overflow, and inf * 0 is NaN.
            deltas = torch.where(valid.bool(), deltas, torch.zeros_like(deltas))

        vs_minus_v = torch.empty_like(deltas)
        running = torch.zeros_like(bootstrap_value, dtype=deltas.dtype)  # v_T - V(x_T) = 0
        for t in reversed(range(rewards.shape[0])):
            running = deltas[t] + discounts[t] * cs[t] * running
            vs_minus_v[t] = running
        vs = values + vs_minus_v

        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0).to(vs.dtype)], dim=0)
        pg_rhos = ratios.clamp(max=pg_rho_bar)
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
        if valid is not None:
            pg_advantages = torch.where(
                valid.bool(), pg_advantages, torch.zeros_like(pg_advantages)
            )
    return VTraceReturns(vs=vs.detach(), pg_advantages=pg_advantages.detach())


def check_loss_inputs(
    loss: str, logits: Tensor, vtrace_returns: VTraceReturns, **tensors: Tensor | None
) -> tuple[int, int]:
    """``(T, B)`` of a loss's inputs: ``logits [T, B, A]``, the V-trace outputs and every one
    of ``tensors`` (None: not given) ``[T, B]``. ValueError (naming the input) otherwise, or when
    the V-trace outputs require grad (not computed by :func:`vtrace`): they are constants.
    Continuous ``actions`` are ``[T, B, A]``: only their first two dims are checked."""
    vs, pg_adv = vtrace_returns.vs, vtrace_returns.pg_advantages
    if vs.requires_grad or pg_adv.requires_grad:
        raise ValueError(f"{loss}: vtrace_returns require grad; compute them with vtrace()")
    if logits.ndim != 3:
        raise ValueError(f"logits must be [T, B, A], got shape {tuple(logits.shape)}")
    expected = (logits.shape[0], logits.shape[1])
    named = {**tensors, "vtrace_returns.vs": vs, "vtrace_returns.pg_advantages": pg_adv}
    for name, arr in named.items():
        if name == "actions" and arr is not None and arr.ndim == 3:
            arr = arr[..., 0]  # continuous actions [T, B, A]
        if arr is not None and tuple(arr.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}, expected {expected} (logits.shape[:2])"
            )
    return expected


@dataclass
class UnrollForward:
    """The learner's forward pass over a batch of unrolls and its V-trace targets, time-major.

    ``logits [T, B, A]`` (``[T, B, 2A]``, the mean and log-std, for a Gaussian policy) and
    ``values [T, B]`` carry gradients; the rest are constants."""

    logits: Tensor
    values: Tensor
    actions: Tensor  # [T, B]; continuous: [T, B, A]
    behaviour_logp: Tensor  # [T, B], log mu(a_t|x_t), recorded by the actors
    target_logp: Tensor  # [T, B], log pi(a_t|x_t), detached
    valid: Tensor  # [T, B], 1.0 on real transitions, 0.0 on autoreset steps
    returns: VTraceReturns
    distribution: ActionDistribution = CATEGORICAL

    def mean_rho(self) -> Tensor:
        """The mean importance ratio pi/mu over the valid steps (1.0 on-policy), 0-d."""
        with torch.no_grad():
            rho = torch.exp(self.target_logp - self.behaviour_logp)
            rho = torch.where(self.valid.bool(), rho, torch.zeros_like(rho))
            return rho.sum() / self.valid.sum().clamp(min=1)


def unroll_forward(
    model: torch.nn.Module,
    batch: dict[str, Tensor],
    *,
    gamma: float,
    rho_bar: float,
    c_bar: float,
    lambda_: float = 1.0,
    value_normalizer: ValueNormalizer | None = None,
) -> UnrollForward:
    """The model's outputs over a batch of unrolls and their bootstrap observations
    (:func:`zrl.algos.kernel.unrolls.unroll_outputs`: one forward pass, or a recurrent
    model's unroll from the recorded states), and the V-trace targets under its current policy
    and values.

    ``batch`` is env-major as the replay server stores unrolls: ``obs [B, T, *obs_shape]`` (any
    observation shape and dtype: only the first two axes are flattened, the model gets the
    rest), ``action``, ``logp`` (behaviour), ``reward``, ``terminated``, ``valid`` ``[B, T]``
    and ``bootstrap_obs [B, *obs_shape]`` (and ``state [B, R]``, ``first [B, T]`` for a
    recurrent model). ``model(obs) -> (logits, values)``; a Gaussian model's (its
    ``distribution``, :func:`zrl.nets.gaussian.distribution_of`) ``action`` is ``[B, T, A]``
    and its log-probabilities are densities summed over the action dims. Discounts are
    ``gamma * (1 - terminated)`` on valid steps and 0 on invalid ones (see :func:`vtrace`).
    Everything stays on the batch's device. With a ``value_normalizer`` the model's values are
    normalized ones: V-trace bootstraps from them denormalized, and ``returns.vs`` is raw
    (``values`` stays the head's output, with gradients).
    """
    logits_bt, values_bt, bootstrap = unroll_outputs(model, batch)
    logits = logits_bt.transpose(0, 1)
    values = values_bt.T
    bootstrap = bootstrap.detach()
    valid = batch["valid"].T.to(values.dtype)
    distribution = distribution_of(model)
    actions = batch["action"].transpose(0, 1)
    behaviour_logp = batch["logp"].T.to(values.dtype)
    target_logp = distribution.log_prob(logits.detach(), actions)
    discounts = gamma * (1.0 - batch["terminated"].T.to(values.dtype)) * valid
    raw_values = values.detach()
    if value_normalizer is not None:
        raw_values = value_normalizer.denormalize(raw_values)
        bootstrap = value_normalizer.denormalize(bootstrap)
    returns = vtrace(
        behaviour_logp,
        target_logp,
        batch["reward"].T.to(values.dtype) * valid,
        discounts,
        raw_values,
        bootstrap,
        rho_bar=rho_bar,
        c_bar=c_bar,
        valid=valid,
        lambda_=lambda_,
    )
    return UnrollForward(
        logits, values, actions, behaviour_logp, target_logp, valid, returns, distribution
    )
