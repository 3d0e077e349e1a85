"""R2D2 learner math (Kapturowski et al., ICLR 2019): pure functions on batch-major tensors.

* :func:`value_rescale` / :func:`inverse_value_rescale`: the invertible value rescaling
  ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` and its closed-form inverse (Pohlen et al.
  2018, "Observe and Look Further", Proposition A.2), used by R2D2 in place of reward clipping.
* :func:`sequence_priority`: the mixed max/mean sequence priority
  ``p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t|`` (Section 3, ``eta = 0.9``).
* :func:`r2d2_loss`: importance-weighted squared TD loss averaged over each sequence's
  trained steps.

What R2D2 shares with recurrent QMIX is the kernel's (``zrl.algos.kernel.q_learning``): the
n-step double-Q target of the paper's Section 2 (``nstep_double_q_targets``,
``sum_{i<k} gamma^i r_{t+i} + gamma^k h^-1(Q_target(s_{t+k}, argmax_a Q_online(s_{t+k}, a)))``
in raw return space; the caller applies ``h`` and the un-rescaling of the bootstrap) and the
"burn-in" strategy of Section 3 (``burn_in_unroll``: unroll the first steps without gradient
only to refresh the replayed recurrent state, then train on the rest).

Shapes: ``B`` sequences of ``L`` steps; ``mask`` is True for real steps and False for padding
(at the front of a sequence that started with its episode, at the end of one that ended).
"""

from __future__ import annotations

import torch
from torch import Tensor

from zrl.algos.kernel.q_learning import check_same_shape


def value_rescale(x: Tensor, eps: float = 1e-3) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``; elementwise, any shape.

    ``eps >= 0``. ``eps = 0`` is allowed and :func:`inverse_value_rescale` stays exact, but then
    ``h^-1`` grows quadratically: the ``eps x`` term is what keeps it Lipschitz (Pohlen et al.
    2018), so leave it on for training. ``sqrt(|x| + 1) - 1`` is evaluated as
    ``|x| / (sqrt(|x| + 1) + 1)`` so small ``|x|`` keep full float32 precision.
    """
    _check_eps(eps)
    abs_x = x.abs()
    return torch.sign(x) * abs_x / (torch.sqrt(abs_x + 1.0) + 1.0) + eps * x


def inverse_value_rescale(x: Tensor, eps: float = 1e-3) -> Tensor:
    """Exact inverse of :func:`value_rescale`; elementwise, any shape.

    Algebraically ``sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``. That
    form cancels catastrophically near ``x = 0`` in float32 and divides by zero at ``eps = 0``,
    so it is rearranged: with ``s = sqrt(1 + 4 eps (|x| + 1 + eps))`` and
    ``y = (s - 1) / (2 eps) = 2 (|x| + 1 + eps) / (s + 1)`` (the value of ``sqrt(|h^-1(x)| + 1)``),
    ``y^2 - 1 = (y - 1)(y + 1)`` and
    ``y - 1 = 4 |x| (|x| + 1 + eps) / ((2 |x| + 1 + 2 eps + s)(s + 1))``, which has no subtraction.
    At ``eps = 0`` it reduces to ``sign(x) ((|x| + 1)^2 - 1)``.
    """
    _check_eps(eps)
    abs_x = x.abs()
    s = torch.sqrt(1.0 + 4.0 * eps * (abs_x + 1.0 + eps))
    y_minus_1 = (
        4.0 * abs_x * (abs_x + 1.0 + eps) / ((2.0 * abs_x + 1.0 + 2.0 * eps + s) * (s + 1.0))
    )
    return torch.sign(x) * y_minus_1 * (y_minus_1 + 2.0)


def sequence_priority(td_abs: Tensor, mask: Tensor, eta: float = 0.9) -> Tensor:
    """R2D2 sequence priority ``eta max_t |delta_t| + (1 - eta) mean_t |delta_t|``; ``[B]``.

    Both reductions run over the masked (real) steps of each row only; a row without a real
    step gets priority 0. Shapes: td_abs ``[B, L]`` (``|delta|``), mask ``[B, L]`` bool.
    The max term keeps one large error from being averaged away over a long sequence, which
    is why the paper mixes it in.
    """
    check_same_shape("mask", mask, "td_abs", td_abs)
    if td_abs.ndim != 2:
        raise ValueError(f"td_abs must be [B, L], got shape {tuple(td_abs.shape)}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got eta={eta!r}")
    mask = mask.bool()
    count = mask.sum(dim=1)
    if td_abs.shape[1] == 0:
        return td_abs.new_zeros(td_abs.shape[0])
    # -inf rather than 0 so the max ignores padding even if a caller passes signed errors.
    peak = td_abs.masked_fill(~mask, float("-inf")).amax(dim=1)
    mean = td_abs.masked_fill(~mask, 0.0).sum(dim=1) / count.clamp(min=1).to(td_abs.dtype)
    priority = eta * peak + (1.0 - eta) * mean
    return torch.where(count > 0, priority, torch.zeros_like(priority))


def r2d2_loss(
    q_taken: Tensor, targets_rescaled: Tensor, train_mask: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """Importance-weighted squared TD loss over sequences.

    ``loss = mean_b w_b * sum_t m_bt 0.5 delta_bt^2 / max(1, sum_t m_bt)`` with
    ``delta = targets_rescaled - q_taken``: each sequence counts once however many real steps it
    has, matching the per-sequence priorities. Shapes: q_taken / targets_rescaled / train_mask
    ``[B, L]``, weights ``[B]``. ``targets_rescaled`` must be detached (``ValueError``
    otherwise), as in :func:`zrl.algos.apex_dqn.losses.dqn_loss`.
    Returns ``(loss, td_abs)`` with ``td_abs = |delta|`` detached, ``[B, L]``, 0 where
    ``train_mask`` is False.
    """
    if targets_rescaled.requires_grad:
        raise ValueError("r2d2_loss: targets require grad; compute them under torch.no_grad()")
    if q_taken.ndim != 2:
        raise ValueError(f"q_taken must be [B, L], got shape {tuple(q_taken.shape)}")
    check_same_shape("targets_rescaled", targets_rescaled, "q_taken", q_taken)
    check_same_shape("train_mask", train_mask, "q_taken", q_taken)
    if tuple(weights.shape) != (q_taken.shape[0],):
        raise ValueError(
            f"weights has shape {tuple(weights.shape)}, expected {(q_taken.shape[0],)}"
        )
    mask = train_mask.bool()
    # Select before squaring: a non-finite value at a padding step must not reach the loss
    # or, through 0 * inf, its gradient.
    td = torch.where(mask, targets_rescaled - q_taken, 0.0)
    count = mask.sum(dim=1).clamp(min=1).to(td.dtype)
    per_sequence = (0.5 * td.square()).sum(dim=1) / count
    loss = (weights.to(td.dtype) * per_sequence).mean()
    return loss, td.detach().abs()


def _check_eps(eps: float) -> None:
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got eps={eps!r}")
