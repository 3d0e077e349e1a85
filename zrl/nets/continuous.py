"""Networks for continuous (``Box``) action spaces: Ape-X DDPG / TD3 and SAC.

Every policy ends in ``tanh``, so its raw output lies in ``[-1, 1]``, and is mapped to the
environment's bounds by the affine map ``a = action_bias + action_scale * tanh(u)`` with
``action_scale = (high - low) / 2`` and ``action_bias = (high + low) / 2``. These (and the bounds
themselves, used to clamp away float32 rounding) are registered float32 buffers, so they ship
with ``state_dict`` and :func:`zrl.nets.wire.model_to_arrays` /
:func:`zrl.nets.wire.load_arrays` work unchanged: an actor that loads the weights acts
inside the bounds with no extra configuration.

The squashed-Gaussian (SAC) policy samples ``u = mu + std * eps`` with ``eps ~ N(0, I)`` (the
reparameterisation trick, so ``a`` is differentiable in the policy weights) and reports the
log-density of the *scaled* action by the change of variables::

    log pi(a|s) = sum_j [ log N(u_j; mu_j, std_j)
                          - log(1 - tanh(u_j)^2)
                          - log(action_scale_j) ]

with ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, which stays finite where the naive
form underflows to ``log 0`` for ``|u| > ~9`` in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike
from torch import Tensor, nn

from zrl.config.sections import ModelConfig
from zrl.nets.encoders import mlp

_LOG_2PI = math.log(2.0 * math.pi)


def _check_sizes(obs_dim: int, act_dim: int, hidden: Sequence[int]) -> None:
    if obs_dim < 1 or act_dim < 1:
        raise ValueError(
            f"obs_dim and act_dim must be >= 1, got obs_dim={obs_dim}, act_dim={act_dim}"
        )
    if any(width < 1 for width in hidden):
        raise ValueError(f"hidden widths must be >= 1, got hidden={tuple(hidden)}")


def _as_float(obs: Tensor) -> Tensor:
    """``[B, *obs_shape]`` -> float ``[B, obs_dim]``."""
    if not obs.is_floating_point():
        obs = obs.float()
    return obs.flatten(start_dim=1)


def _bounds(
    act_dim: int, action_low: ArrayLike | None, action_high: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 ``(low, high)`` of shape ``[act_dim]``; ``None`` means ``[-1, 1]``."""
    raw_low = np.asarray(-1.0 if action_low is None else action_low, dtype=np.float64)
    raw_high = np.asarray(1.0 if action_high is None else action_high, dtype=np.float64)
    if raw_low.shape not in ((), (act_dim,)) or raw_high.shape not in ((), (act_dim,)):
        raise ValueError(
            f"action bounds must be scalars or of shape ({act_dim},) for act_dim={act_dim}, got "
            f"action_low shape {raw_low.shape}, action_high shape {raw_high.shape}"
        )
    low = np.broadcast_to(raw_low, (act_dim,))
    high = np.broadcast_to(raw_high, (act_dim,))
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ValueError(
            f"action bounds must be finite, got action_low={low.tolist()}, "
            f"action_high={high.tolist()}"
        )
    if not np.all(high > low):
        raise ValueError(
            f"action bounds need high > low in every dimension, got action_low={low.tolist()}, "
            f"action_high={high.tolist()}"
        )
    return low, high


class _ScaledActions(nn.Module):
    """Registers the bounds buffers and maps ``y in [-1, 1]`` to ``[low, high]``."""

    action_scale: Tensor
    action_bias: Tensor
    action_low: Tensor
    action_high: Tensor

    def __init__(
        self, act_dim: int, action_low: ArrayLike | None, action_high: ArrayLike | None
    ) -> None:
        super().__init__()
        low, high = _bounds(act_dim, action_low, action_high)
        buffers = {
            "action_scale": (high - low) / 2.0,
            "action_bias": (high + low) / 2.0,
            "action_low": low,
            "action_high": high,
        }
        for name, value in buffers.items():
            self.register_buffer(name, torch.tensor(value, dtype=torch.float32))

    def scale_actions(self, squashed: Tensor) -> Tensor:
        """``bias + scale * y`` for ``y = tanh(u) in [-1, 1]``, clamped to ``[low, high]`` (the
        clamp only removes float32 rounding of ``bias + scale`` at the edges)."""
        actions = self.action_bias + self.action_scale * squashed
        return torch.clamp(actions, min=self.action_low, max=self.action_high)


class DeterministicPolicy(_ScaledActions):
    """DDPG actor ``mu(s) = bias + scale * tanh(MLP(s))``: ``[B, obs_dim] -> [B, act_dim]``.

    The output layer starts at ``U(-3e-3, 3e-3)`` (Lillicrap et al. 2016), so initial actions
    sit near the centre of the box instead of in the saturated tails of ``tanh``.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        *,
        action_low: ArrayLike | None = None,
        action_high: ArrayLike | None = None,
    ) -> None:
        _check_sizes(obs_dim, act_dim, hidden)
        super().__init__(act_dim, action_low, action_high)
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.torso = mlp(obs_dim, hidden)
        self.head = nn.Linear(hidden[-1] if len(hidden) > 0 else obs_dim, act_dim)
        nn.init.uniform_(self.head.weight, -3e-3, 3e-3)
        nn.init.uniform_(self.head.bias, -3e-3, 3e-3)

    def forward(self, obs: Tensor) -> Tensor:
        """``obs [B, obs_dim]`` (or ``[B, *obs_shape]``, flattened) -> actions ``[B, act_dim]``."""
        return self.scale_actions(torch.tanh(self.head(self.torso(_as_float(obs)))))


def tanh_log_det_jacobian(u: Tensor) -> Tensor:
    """Elementwise ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, finite for all ``u``."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def squashed_gaussian_logp(u: Tensor, mu: Tensor, log_std: Tensor, action_scale: Tensor) -> Tensor:
    """Log-density of ``a = bias + scale * tanh(u)`` for ``u ~ N(mu, exp(log_std)^2)``.

    ``sum_j [log N(u_j; mu_j, std_j) - log(1 - tanh(u_j)^2) - log(scale_j)]``; u/mu/log_std
    ``[B, A]``, action_scale ``[A]`` -> ``[B]``.
    """
    z = (u - mu) * torch.exp(-log_std)
    gaussian = -0.5 * z.square() - log_std - 0.5 * _LOG_2PI
    return (gaussian - tanh_log_det_jacobian(u) - torch.log(action_scale)).sum(dim=-1)


class SquashedGaussianPolicy(_ScaledActions):
    """SAC actor: ``u ~ N(mu(s), std(s))``, ``a = bias + scale * tanh(u)``.

    ``log_std`` is squashed smoothly into ``[log_std_min, log_std_max]`` as
    ``min + (max - min) * (tanh(raw) + 1) / 2`` (as CleanRL), which keeps its gradient alive
    where a hard clamp would cut it.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
        *,
        action_low: ArrayLike | None = None,
        action_high: ArrayLike | None = None,
    ) -> None:
        _check_sizes(obs_dim, act_dim, hidden)
        if not (math.isfinite(log_std_min) and math.isfinite(log_std_max)):
            raise ValueError(
                f"log_std bounds must be finite, got log_std_min={log_std_min!r}, "
                f"log_std_max={log_std_max!r}"
            )
        if not log_std_min < log_std_max:
            raise ValueError(
                f"need log_std_min < log_std_max, got log_std_min={log_std_min!r}, "
                f"log_std_max={log_std_max!r}"
            )
        super().__init__(act_dim, action_low, action_high)
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.log_std_min = float(log_std_min)
        self.log_std_max = float(log_std_max)
        self.torso = mlp(obs_dim, hidden)
        features = hidden[-1] if len(hidden) > 0 else obs_dim
        self.mu_head = nn.Linear(features, act_dim)
        self.log_std_head = nn.Linear(features, act_dim)

    def dist_params(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``obs [B, obs_dim]`` -> ``(mu, log_std)``, both ``[B, act_dim]`` (pre-tanh space)."""
        x = self.torso(_as_float(obs))
        raw = torch.tanh(self.log_std_head(x))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (raw + 1.0)
        return self.mu_head(x), log_std

    def forward(
        self, obs: Tensor, deterministic: bool = False, with_logp: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """``obs [B, obs_dim]`` -> ``(actions [B, act_dim], logp [B] or None)``.

        Stochastic: reparameterised ``u = mu + std * eps`` (``eps = torch.randn_like(mu)``).
        Deterministic: ``u = mu``, i.e. the action ``bias + scale * tanh(mu)`` (its ``logp`` is
        the density at that point). ``with_logp=False`` skips the log-density and returns None.
        """
        mu, log_std = self.dist_params(obs)
        u = mu if deterministic else mu + torch.exp(log_std) * torch.randn_like(mu)
        actions = self.scale_actions(torch.tanh(u))
        logp = squashed_gaussian_logp(u, mu, log_std, self.action_scale) if with_logp else None
        return actions, logp


class QCritic(nn.Module):
    """``Q(s, a) = MLP([s, a])``: obs ``[B, obs_dim]``, actions ``[B, act_dim]`` -> ``[B]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        _check_sizes(obs_dim, act_dim, hidden)
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.torso = mlp(obs_dim + act_dim, hidden)
        self.head = nn.Linear(hidden[-1] if len(hidden) > 0 else obs_dim + act_dim, 1)

    def forward(self, obs: Tensor, actions: Tensor) -> Tensor:
        """``(obs [B, obs_dim], actions [B, act_dim]) -> q [B]``."""
        x = torch.cat([_as_float(obs), actions.to(self.head.weight.dtype)], dim=1)
        return self.head(self.torso(x)).squeeze(1)


class PolicyAndCritics(nn.Module):
    """A policy (``policy_type``) over ``obs [B, obs_dim]`` acting inside the bounds
    ``action_low..action_high``, and critics ``q1`` (and ``q2`` when ``twin``, always when
    ``twin_only``) over ``(obs, actions [B, act_dim])``: what DDPG and SAC share."""

    policy_type: ClassVar[type[DeterministicPolicy | SquashedGaussianPolicy]]
    twin_only: ClassVar[bool] = False

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden: Sequence[int] = (256, 256),
        twin: bool = False,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.policy = self.policy_type(
            obs_dim, act_dim, hidden, action_low=action_low, action_high=action_high
        )
        self.q1 = QCritic(obs_dim, act_dim, hidden)
        twin = twin or self.twin_only
        self.q2: QCritic | None = QCritic(obs_dim, act_dim, hidden) if twin else None

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        raise NotImplementedError

    def forward(self, obs: Tensor) -> Tensor:
        return self.act(obs)


class DDPGModel(PolicyAndCritics):
    """Ape-X DDPG actor-critic: deterministic policy ``mu`` and critic ``q1`` (plus ``q2`` for
    TD3's clipped double-Q when ``twin``). Exploration noise is added by the actor process, not
    here."""

    policy_type = DeterministicPolicy
    policy: DeterministicPolicy

    @property
    def twin(self) -> bool:
        return self.q2 is not None

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """The policy's action ``mu(s)`` ``[B, act_dim]`` (``deterministic`` is accepted for a
        uniform interface with :class:`SACModel`; DDPG's policy is always deterministic)."""
        return self.policy(obs)

    def q_values(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(Q1(s, a), Q2(s, a) or None)``, each ``[B]``."""
        return self.q1(obs, actions), (None if self.q2 is None else self.q2(obs, actions))


class SACModel(PolicyAndCritics):
    """Soft actor-critic (Haarnoja et al. 2018): squashed-Gaussian policy and twin critics."""

    policy_type = SquashedGaussianPolicy
    twin_only = True
    policy: SquashedGaussianPolicy
    q2: QCritic  # always twin

    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """A sampled action (``deterministic``: ``bias + scale * tanh(mu)``), ``[B, act_dim]``."""
        return self.policy(obs, deterministic=deterministic, with_logp=False)[0]

    def sample(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Reparameterised ``(actions [B, act_dim], logp [B])``."""
        actions, logp = self.policy(obs, deterministic=False, with_logp=True)
        assert logp is not None
        return actions, logp

    def q_values(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """``(Q1(s, a), Q2(s, a))``, each ``[B]``."""
        return self.q1(obs, actions), self.q2(obs, actions)


def build_continuous_model(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_type: type[DDPGModel] | type[SACModel],
    hidden: Sequence[int],
    twin: bool,
) -> DDPGModel | SACModel:
    """A ``model_type`` (:class:`DDPGModel` or :class:`SACModel`) for a ``Box`` observation
    space (flattened) and a 1-D ``Box`` action space with finite bounds. ``twin`` only applies
    to DDPG (TD3's clipped double-Q); SAC always has twin critics."""
    name = model_type.__name__
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: continuous models need a Box"
        )
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported action space {action_space!r}: {name} needs a 1-D Box action space"
        )
    if len(action_space.shape) != 1 or action_space.shape[0] < 1:
        raise ValueError(
            f"unsupported action space {action_space!r}: {name} needs a 1-D Box action space, "
            f"got shape {action_space.shape}"
        )
    low = np.asarray(action_space.low, dtype=np.float64)
    high = np.asarray(action_space.high, dtype=np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ValueError(
            f"unsupported action space {action_space!r}: {name} needs finite bounds with "
            f"high > low, got low={low.tolist()}, high={high.tolist()}"
        )
    obs_dim = math.prod(observation_space.shape)
    act_dim = int(action_space.shape[0])
    if model_type is DDPGModel:
        return DDPGModel(obs_dim, act_dim, low, high, hidden=hidden, twin=twin)
    return SACModel(obs_dim, act_dim, low, high, hidden=hidden)


def ddpg_model_for(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    twin: bool = False,
) -> nn.Module:
    """zrl's network for Ape-X DDPG (``Algorithm.model``; ``twin``: TD3's second critic,
    ``ddpg.twin``)."""
    return build_continuous_model(
        observation_space, action_space, DDPGModel, model_cfg.hidden, twin
    )


def sac_model_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> nn.Module:
    """zrl's network for SAC (``Algorithm.model``; always twin critics)."""
    return build_continuous_model(observation_space, action_space, SACModel, model_cfg.hidden, True)


def clip_to_bounds(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``clip(actions, low, high)`` elementwise (``actions [..., A]``, bounds ``[A]``), returned in
    ``low``'s dtype (the action space's). Rounding the clipped value to that dtype cannot leave
    the box, since the bounds are representable in it.

    A NaN/inf action raises ``ValueError`` instead: clipping would silently turn NaN into a
    bound (or pass it to the env), hiding a diverged policy.
    """
    actions = np.asarray(actions)
    low_arr, high_arr = np.asarray(low), np.asarray(high)
    if actions.shape[-1:] != low_arr.shape[-1:] or low_arr.shape != high_arr.shape:
        raise ValueError(
            f"clip_to_bounds: actions of shape {actions.shape} do not match bounds of shape "
            f"low {low_arr.shape}, high {high_arr.shape}"
        )
    if not np.all(np.isfinite(actions)):
        raise ValueError(f"non-finite action {actions.tolist()}: the policy diverged")
    dtype = low_arr.dtype if np.issubdtype(low_arr.dtype, np.floating) else np.float32
    return np.clip(actions.astype(np.float64), low_arr, high_arr).astype(dtype)
