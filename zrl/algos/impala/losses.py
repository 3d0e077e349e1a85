"""IMPALA learner math: the actor-critic loss on V-trace targets and one update (Espeholt et al.
2018). The V-trace targets and the forward pass over unrolls are the kernel's
(``zrl.algos.kernel.vtrace``); its conventions hold here: ``[T, B]`` tensors are time-major.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from zrl.algos.kernel.optim import checked_step, deferred_step
from zrl.algos.kernel.returns import check_nonnegative
from zrl.algos.kernel.vtrace import VTraceReturns, check_loss_inputs, unroll_forward
from zrl.nets.gaussian import CATEGORICAL, ActionDistribution


def impala_loss(
    logits: Tensor,
    values: Tensor,
    actions: Tensor,
    vtrace_returns: VTraceReturns,
    entropy_coef: float,
    value_coef: float,
    valid: Tensor | None = None,
    distribution: ActionDistribution = CATEGORICAL,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IMPALA actor-critic loss on V-trace targets, averaged over the ``T * B`` steps (over the
    ``valid`` ones when a ``[T, B]`` mask is given).

    ``policy_loss = -mean(log pi(a_s|x_s) * A_s)``, ``value_loss = mean(0.5 * (v_s - V(x_s))^2)``,
    ``entropy = mean(H(pi(.|x_s)))`` and
    ``loss = policy_loss + value_coef * value_loss - entropy_coef * entropy``.

    ``logits [T, B, A]`` and ``values [T, B]`` come from the learner's forward pass (with
    gradients); ``actions [T, B]`` are the actors' actions. ``distribution`` reads the logits:
    categorical, or :data:`zrl.nets.gaussian.DIAG_GAUSSIAN` for a Gaussian policy (``logits [T, B,
    2A]`` the mean and log-std, ``actions [T, B, A]``, log-densities and entropies summed over the
    action dims). The V-trace outputs are constants: if they require grad (not computed by
    ``zrl.algos.kernel.vtrace.vtrace``) this raises ``ValueError``. Returns ``(loss, parts)`` with
    the parts ``loss, policy_loss, value_loss, entropy`` as detached 0-d tensors, nothing read
    back to the host (a GPU learner's ``TrainStats`` reads them at the metrics report).
    """
    expected = check_loss_inputs(
        "impala_loss", logits, vtrace_returns, values=values, actions=actions, valid=valid
    )
    vs, pg_adv = vtrace_returns.vs, vtrace_returns.pg_advantages
    check_nonnegative("entropy_coef", entropy_coef)
    check_nonnegative("value_coef", value_coef)

    if valid is None:
        weight = torch.full(
            expected,
            1.0 / max(1, logits.shape[0] * logits.shape[1]),
            dtype=logits.dtype,
            device=logits.device,
        )
    else:
        weight = valid.to(logits.dtype) / valid.sum().clamp(min=1)
    logp_taken = distribution.log_prob(logits, actions)
    policy_loss = -(logp_taken * pg_adv * weight).sum()
    value_loss = 0.5 * ((vs - values).square() * weight).sum()
    entropy = (distribution.entropy(logits) * weight).sum()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    parts = dict(loss=loss, policy_loss=policy_loss, value_loss=value_loss, entropy=entropy)
    return loss, {name: part.detach() for name, part in parts.items()}


@dataclass
class ImpalaStepResult:
    """Result of one :func:`impala_update` step."""

    parts: Mapping[str, float | Tensor]  # loss, policy_loss, value_loss, entropy
    grad_norm: float | Tensor  # global L2 norm of the gradients before clipping
    mean_rho: float | Tensor  # mean importance ratio pi/mu over the valid steps (1.0 on-policy)
    finite: Tensor | None = None
    """Checked on the device (``finite`` given to :func:`impala_update`): 0-d tensors above,
    and this flag, False when the step was skipped for a NaN/inf loss or gradient."""


def impala_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    *,
    gamma: float,
    rho_bar: float,
    c_bar: float,
    entropy_coef: float,
    value_coef: float,
    grad_clip: float,
    lambda_: float = 1.0,
    finite: Tensor | None = None,
    step: Callable[[Tensor, Tensor], float] | None = None,
) -> ImpalaStepResult:
    """One IMPALA step on a batch of unrolls from the actors' queue (``batch`` as
    :func:`unroll_forward` reads it). ``step(loss, valid)``, when given, takes the optimizer
    step in place of :func:`zrl.algos.kernel.optim.checked_step` and returns the pre-clip norm (a
    learner group's step on the gradients averaged over it, weighted by the valid steps).

    Raises :class:`zrl.algos.api.NonFiniteLossError` before stepping on a NaN/inf loss. With
    ``finite`` (a 0-d bool tensor: the batch's steps so far were finite) nothing is read back
    to the host: the step is :func:`zrl.algos.kernel.optim.deferred_step`'s, skipped on the device
    unless it and ``finite`` are finite, and the result holds tensors.
    """
    f = unroll_forward(model, batch, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, lambda_=lambda_)
    params = list(model.parameters())
    loss, tensors = impala_loss(
        f.logits,
        f.values,
        f.actions,
        f.returns,
        entropy_coef,
        value_coef,
        valid=f.valid,
        distribution=f.distribution,
    )
    if finite is None:
        if step is not None:
            grad_norm = step(loss, f.valid)
        else:
            grad_norm = checked_step(optimizer, loss, params, grad_clip)
        parts = {name: float(part.item()) for name, part in tensors.items()}
        return ImpalaStepResult(parts=parts, grad_norm=grad_norm, mean_rho=float(f.mean_rho()))
    norm, finite = deferred_step(optimizer, loss, params, grad_clip, finite)
    return ImpalaStepResult(parts=tensors, grad_norm=norm, mean_rho=f.mean_rho(), finite=finite)
