"""On-policy actor-critic losses (PPO, A2C/A3C) and the cross-worker gradient reduction.

The losses take per-sample tensors (any shape, flattened or ``[T, B]``) and average over all
samples. Rollout quantities (old log-probs, advantages, old values, returns) are constants of
the update: they are detached here, so gradients only flow into the new log-probs, the new
values and the entropy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zrl.algos.kernel.returns import check_nonnegative

REDUCE_MODES = ("sum", "mean")


def _check_same_shape(reference: str, tensors: dict[str, Tensor]) -> None:
    """All ``tensors`` must have the shape of ``tensors[reference]`` (no silent broadcasting:
    ``[N, 1]`` values against ``[N]`` returns would otherwise give an ``[N, N]`` loss)."""
    shape = tensors[reference].shape
    for name, arr in tensors.items():
        if arr.shape != shape:
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)} like {reference}"
            )


def normalize(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """``(A - mean(A)) / (std(A) + eps)`` with the unbiased std; a single sample is returned
    as is (its std is undefined)."""
    if advantages.numel() <= 1:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def loss_parts(
    loss: Tensor, policy_loss: Tensor, value_loss: Tensor, entropy: Tensor, **extra: Tensor
) -> dict[str, float]:
    """The float parts an actor-critic loss returns beside it: ``loss, policy_loss,
    value_loss, entropy``, then ``extra`` (diagnostics), each 0-d tensor read once."""
    parts = dict(
        loss=loss, policy_loss=policy_loss, value_loss=value_loss, entropy=entropy, **extra
    )
    return {name: float(value.item()) for name, value in parts.items()}


def ppo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    new_values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    clip: float,
    value_clip: float | None,
    entropy_coef: float,
    value_coef: float,
    normalize_advantages: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped-surrogate loss (Schulman et al. 2017) with PPO2/CleanRL value clipping.

    With ``ratio = exp(new_logp - old_logp)`` and ``A`` the (optionally normalized, see
    :func:`normalize`) advantages::

        policy_loss = -mean(min(ratio * A, clamp(ratio, 1 - clip, 1 + clip) * A))
        value_loss  = 0.5 * mean((V - R)^2)                                 value_clip None
        value_loss  = 0.5 * mean(max((V - R)^2, (V_clip - R)^2))            otherwise,
                      V_clip = V_old + clamp(V - V_old, -value_clip, value_clip)
        loss        = policy_loss + value_coef * value_loss - entropy_coef * mean(entropy)

    Diagnostics (no gradient): ``approx_kl = mean((ratio - 1) - log ratio)``, the low-variance
    estimator of ``KL(old || new)`` CleanRL logs, and ``clip_fraction = mean(|ratio - 1| >
    clip)``. Returns ``(loss, parts)`` with the float parts ``loss, policy_loss, value_loss,
    entropy, approx_kl, clip_fraction``.
    """
    _check_same_shape(
        "new_logp", {"new_logp": new_logp, "old_logp": old_logp, "advantages": advantages}
    )
    _check_same_shape(
        "new_values", {"new_values": new_values, "old_values": old_values, "returns": returns}
    )
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got clip={clip!r}")
    if value_clip is not None and not value_clip > 0:
        raise ValueError(f"value_clip must be > 0 or None, got value_clip={value_clip!r}")
    check_nonnegative("entropy_coef", entropy_coef)
    check_nonnegative("value_coef", value_coef)

    old_logp, old_values, returns = old_logp.detach(), old_values.detach(), returns.detach()
    adv = advantages.detach()
    if normalize_advantages:
        adv = normalize(adv)

    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    # Pessimistic bound: the max of the two negated surrogates is -min(...).
    surrogate = -adv * ratio
    surrogate_clipped = -adv * ratio.clamp(1.0 - clip, 1.0 + clip)
    policy_loss = torch.max(surrogate, surrogate_clipped).mean()

    value_err = (new_values - returns).square()
    if value_clip is None:
        value_loss = 0.5 * value_err.mean()
    else:
        clipped_values = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
        clipped_err = (clipped_values - returns).square()
        value_loss = 0.5 * torch.max(value_err, clipped_err).mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean

    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip).to(ratio.dtype).mean()
    return loss, loss_parts(
        loss,
        policy_loss,
        value_loss,
        entropy_mean,
        approx_kl=approx_kl,
        clip_fraction=clip_fraction,
    )


def a2c_loss(
    logp: Tensor,
    values: Tensor,
    returns: Tensor,
    advantages: Tensor,
    entropy: Tensor,
    entropy_coef: float,
    value_coef: float,
) -> tuple[Tensor, dict[str, float]]:
    """Advantage actor-critic loss of A3C/A2C (Mnih et al. 2016)::

        policy_loss = -mean(log pi(a|s) * A)
        value_loss  = 0.5 * mean((R - V(s))^2)
        loss        = policy_loss + value_coef * value_loss - entropy_coef * mean(entropy)

    ``advantages`` and ``returns`` are detached (``A = R - V`` computed from the same forward
    pass must not push gradients into the critic through the policy term). Returns
    ``(loss, parts)`` with the float parts ``loss, policy_loss, value_loss, entropy``.
    """
    _check_same_shape("logp", {"logp": logp, "advantages": advantages})
    _check_same_shape("values", {"values": values, "returns": returns})
    check_nonnegative("entropy_coef", entropy_coef)
    check_nonnegative("value_coef", value_coef)

    policy_loss = -(logp * advantages.detach()).mean()
    value_loss = 0.5 * (returns.detach() - values).square().mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    return loss, loss_parts(loss, policy_loss, value_loss, entropy_mean)


def reduce_gradients(grads: list[dict[str, Tensor]], mode: str) -> dict[str, Tensor]:
    """Combine per-worker gradients ``{param_name: grad}`` into one dict.

    ``"sum"``: ``g = sum_w g_w``; ``"mean"``: ``g = (1 / W) sum_w g_w``. Every worker must send
    the same names with the same shapes; the result holds new tensors (the inputs are not
    modified) in the key order of ``grads[0]``.
    """
    if mode not in REDUCE_MODES:
        raise ValueError(f"mode must be one of {REDUCE_MODES}, got mode={mode!r}")
    if not grads:
        raise ValueError("reduce_gradients: grads is empty (no worker gradients)")
    first = grads[0]
    for w, worker in enumerate(grads[1:], start=1):
        if worker.keys() != first.keys():
            missing = sorted(set(first) - set(worker))
            extra = sorted(set(worker) - set(first))
            raise ValueError(
                f"reduce_gradients: worker {w} keys differ from worker 0: "
                f"missing {missing}, extra {extra}"
            )
        for name, grad in worker.items():
            if grad.shape != first[name].shape:
                raise ValueError(
                    f"reduce_gradients: {name!r} of worker {w} has shape {tuple(grad.shape)}, "
                    f"worker 0 has {tuple(first[name].shape)}"
                )

    out: dict[str, Tensor] = {}
    for name, grad in first.items():
        total = grad.detach().clone()
        for worker in grads[1:]:
            total.add_(worker[name].detach())
        if mode == "mean":
            total.div_(len(grads))
        out[name] = total
    return out
