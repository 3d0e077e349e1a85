"""What the Q-learning algorithms share: the keys of a replayed transition batch, the Huber
loss and Polyak averaging of a target network (Ape-X DQN, Ape-X DDPG / TD3, SAC); n-step
double-Q targets over sequences and the burn-in unroll of a recurrent Q-network (R2D2 and
recurrent QMIX, Kapturowski et al., ICLR 2019).

Shapes of the sequence functions: ``B`` sequences of ``L`` steps; ``mask`` is True for real
steps and False for padding (at the front of a sequence that started with its episode, at the
end of one that ended).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

BATCH_KEYS = ("obs", "action", "reward", "discount", "next_obs", "weight")

UnrollFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""``(obs [B, T, *O], state [B, S], first [B, T] bool) -> (q [B, T, A], final_state [B, S])``."""


def huber(x: Tensor, delta: float = 1.0) -> Tensor:
    """Elementwise Huber loss: ``0.5 x^2`` if ``|x| <= delta`` else
    ``delta * (|x| - delta / 2)``."""
    abs_x = x.abs()
    return torch.where(abs_x <= delta, 0.5 * x.square(), delta * (abs_x - 0.5 * delta))


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging ``theta_target <- tau * theta_online + (1 - tau) * theta_target``.

    ``tau = 1`` is an exact hard copy. Non-float buffers (e.g. BatchNorm counters) are copied.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got tau={tau!r}")
    # state_dict tensors share storage with the module, so in-place ops update it.
    target_state = target.state_dict()
    online_state = online.state_dict()
    if target_state.keys() != online_state.keys():
        diff = sorted(set(target_state) ^ set(online_state))
        raise ValueError(f"soft_update: target and online differ in keys {diff}")
    with torch.no_grad():
        for name, dst in target_state.items():
            src = online_state[name]
            if tau == 1.0 or not dst.is_floating_point():
                dst.copy_(src)
            else:
                dst.lerp_(src.to(dst.dtype), tau)


def check_same_shape(name: str, value: Tensor, like_name: str, like: Tensor) -> None:
    """ValueError naming ``name`` unless ``value`` has the shape of ``like``."""
    if value.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(value.shape)}, expected {tuple(like.shape)} like {like_name}"
        )


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
    check_same_shape("terminated", terminated, "reward", reward)
    check_same_shape("mask", mask, "reward", reward)
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
