"""R2D2 learner math (Kapturowski et al., ICLR 2019): pure functions on batch-major tensors.

* :func:`value_rescale` / :func:`inverse_value_rescale`: the invertible value rescaling
  ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` and its closed-form inverse (Pohlen et al.
  2018, "Observe and Look Further", Proposition A.2), used by R2D2 in place of reward clipping.
* :func:`nstep_double_q_targets`: the n-step double-Q target of the paper's Section 2,
  ``sum_{i<k} gamma^i r_{t+i} + gamma^k h^-1(Q_target(s_{t+k}, argmax_a Q_online(s_{t+k}, a)))``,
  returned in raw return space; the caller applies ``h`` and the un-rescaling of the bootstrap.
* :func:`sequence_priority`: the mixed max/mean sequence priority
  ``p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t|`` (Section 3, ``eta = 0.9``).
* :func:`r2d2_loss`: importance-weighted squared TD loss averaged over each sequence's
  trained steps.
* :func:`burn_in_unroll`: the "burn-in" strategy (Section 3): unroll the first steps without
  gradient only to refresh the replayed recurrent state, then train on the rest.

Shapes: ``B`` sequences of ``L`` steps; ``mask`` is True for real steps and False for padding
(at the front of a sequence that started with its episode, at the end of one that ended).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

UnrollFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""``(obs [B, T, *O], state [B, S], first [B, T] bool) -> (q [B, T, A], final_state [B, S])``."""


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
    _check_same_shape("mask", mask, "td_abs", td_abs)
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


def nstep_double_q_targets(
    reward: Tensor,
    terminated: Tensor,
    mask: Tensor,
    boot_value: Tensor,
    gamma: float,
    n: int,
) -> Tensor:
    """n-step targets ``G_t`` in raw return space for every step of ``[B, L]`` sequences.

    From a real step ``t`` the walk consumes steps ``t, t+1, ...`` while they are real
    (``mask``), inside the sequence and fewer than ``n``, summing ``gamma^i reward[t+i]``. It
    stops without a bootstrap at a consumed step that ``terminated``; otherwise, after ``k``
    consumed steps, it adds ``gamma^k boot_value[t+k]``. So a walk cut by the sequence end,
    by end padding (a truncated episode) or by ``n`` bootstraps from the observation right
    after its last step. Padding steps get target 0.

    Shapes: reward ``[B, L]``, terminated / mask ``[B, L]`` bool, boot_value ``[B, L+1]`` where
    ``boot_value[:, j]`` is the (un-rescaled) double-Q value of observation ``j``
    (``h^-1(Q_target(s_j, argmax_a Q_online(s_j, a)))``), ``j = L`` being the observation after
    the last step. Returns ``[B, L]`` in ``reward``'s dtype.
    """
    if reward.ndim != 2:
        raise ValueError(f"reward must be [B, L], got shape {tuple(reward.shape)}")
    _check_same_shape("terminated", terminated, "reward", reward)
    _check_same_shape("mask", mask, "reward", reward)
    batch, length = reward.shape
    if tuple(boot_value.shape) != (batch, length + 1):
        raise ValueError(
            f"boot_value has shape {tuple(boot_value.shape)}, expected {(batch, length + 1)} "
            f"(one value per observation, the last one after step L-1)"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got n={n!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got gamma={gamma!r}")

    mask = mask.bool()
    terminated = terminated.bool()
    # Padding n steps past the end makes "t + i >= L" look like an unreal step, so one shifted
    # slice per i replaces every bounds check.
    reward_pad = torch.nn.functional.pad(reward, (0, n))
    mask_pad = torch.nn.functional.pad(mask, (0, n), value=False)
    term_pad = torch.nn.functional.pad(terminated, (0, n), value=False)

    ret = torch.zeros_like(reward)
    steps = torch.zeros(batch, length, dtype=torch.long, device=reward.device)
    walking = mask.clone()
    ended = torch.zeros_like(mask)  # the walk consumed a terminal step: no bootstrap
    for i in range(n):
        consume = walking & mask_pad[:, i : i + length]
        ret = ret + torch.where(consume, (gamma**i) * reward_pad[:, i : i + length], 0.0)
        steps = steps + consume.long()
        hit_end = consume & term_pad[:, i : i + length]
        ended = ended | hit_end
        walking = consume & ~hit_end

    start = torch.arange(length, device=reward.device).expand(batch, length)
    boot = boot_value.to(reward.dtype).gather(1, start + steps)
    discount = torch.pow(torch.tensor(gamma, dtype=reward.dtype, device=reward.device), steps)
    bootstrap = mask & ~ended
    return torch.where(mask, ret + torch.where(bootstrap, discount * boot, 0.0), 0.0)


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
    _check_same_shape("targets_rescaled", targets_rescaled, "q_taken", q_taken)
    _check_same_shape("train_mask", train_mask, "q_taken", q_taken)
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


def burn_in_unroll(
    unroll: UnrollFn, obs: Tensor, state: Tensor, first: Tensor, burn_in: int
) -> tuple[Tensor, Tensor]:
    """Unroll a recurrent Q-network with R2D2's burn-in.

    The first ``burn_in`` steps run under ``torch.no_grad()`` only to turn the (stale) replayed
    ``state`` into one produced by the current network; the remaining ``T - burn_in`` steps
    run from that state with gradients. No gradient reaches ``state`` or the burn-in
    observations, also when ``burn_in == 0`` (the replayed state is data, not a parameter).
    Shapes: obs ``[B, T, *O]``, state ``[B, S]``, first ``[B, T]`` bool (episode starts, the
    ``unroll`` resets its state there). Needs ``0 <= burn_in < T``.
    Returns ``(q_burn [B, burn_in, A]`` without grad, ``q_train [B, T - burn_in, A])``.
    """
    if obs.ndim < 2:
        raise ValueError(f"obs must be [B, T, *O], got shape {tuple(obs.shape)}")
    horizon = obs.shape[1]
    if tuple(first.shape) != tuple(obs.shape[:2]):
        raise ValueError(
            f"first has shape {tuple(first.shape)}, expected {tuple(obs.shape[:2])} (obs [B, T])"
        )
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or not 0 <= burn_in < horizon:
        raise ValueError(f"burn_in must be an integer in [0, T={horizon}), got burn_in={burn_in!r}")
    state = state.detach()
    q_burn: Tensor | None = None
    if burn_in > 0:
        with torch.no_grad():
            q_burn, state = unroll(obs[:, :burn_in], state, first[:, :burn_in])
        state = state.detach()
    q_train, _ = unroll(obs[:, burn_in:], state, first[:, burn_in:])
    if q_burn is None:
        q_burn = q_train.new_zeros((q_train.shape[0], 0, *q_train.shape[2:])).detach()
    return q_burn, q_train


def _check_eps(eps: float) -> None:
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got eps={eps!r}")


def _check_same_shape(name: str, value: Tensor, like_name: str, like: Tensor) -> None:
    if value.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(value.shape)}, expected {tuple(like.shape)} like {like_name}"
        )
