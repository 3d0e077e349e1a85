"""The diagonal Gaussian actor-critic of PPO, IMPALA and APPO on 1-D ``Box`` action spaces, and
the action distributions the policy-gradient learners score actions with.

:class:`GaussianActorCritic` is CleanRL's ``ppo_continuous_action.py`` network: separate
``hidden`` MLP torsos for the policy and the value, a linear head for the mean and a
*state-independent* log standard deviation (one parameter per action dim, initially 0), with
orthogonal initialisation (a 0.01-gain mean head). Its ``forward`` gives ``(params, value)``
where ``params [B, 2A]`` is the mean and the log-std side by side: the Gaussian's "logits",
so everything that moves a categorical's logits (the unroll forward of IMPALA and APPO, the
inference role's ``policy_logits``) moves them unchanged.

Actions are the *unclipped* samples ``a = mean + std * eps``: their log-density is what the
actors record and the learners use (CleanRL's choice). The env gets ``a`` clipped to the Box
(``GaussianActorCritic.clip``); the clipping is outside the distribution, so the log-density
of an action past a bound is that of the sample, not of the bound. The bounds are float32
buffers, shipped with the weights.

On image observations (``[C, H, W]``: dm_control's pixels) a CNN encoder (``model.encoder``
``nature_cnn``, the default there, or ``impala_resnet``) reads them first and both torsos
take its features; the encoder learns from the policy's and the value's losses together, as
Sample Factory's shared encoder does.

With ``model.normalize_input`` the model gets an :class:`~zrl.nets.encoders.InputNormalizer`
over the flattened observation (its image encoder one over the images: running mean and
variance, clipped to +-5), applied before both torsos; its statistics are buffers (in
checkpoints and in the shipped weights), updated by the learner only
(:func:`zrl.nets.encoders.observe_inputs`).

:data:`CATEGORICAL` and :data:`DIAG_GAUSSIAN` are the two :class:`ActionDistribution`s:
log-probabilities of taken actions and entropies from a model's params ("logits");
:func:`distribution_of` is a model's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike
from torch import Tensor, nn

from zrl.config.sections import ModelConfig
from zrl.nets.continuous import _bounds
from zrl.nets.discrete import init_actor_critic
from zrl.nets.encoders import (
    ACTIVATIONS,
    ImageEncoder,
    InputNormalizer,
    MLPEncoder,
    build_encoder,
    resolve_encoder,
)

LOG_2PI = math.log(2.0 * math.pi)


def split_params(params: Tensor) -> tuple[Tensor, Tensor]:
    """``params [..., 2A]`` -> ``(mean [..., A], log_std [..., A])``."""
    if params.shape[-1] % 2:
        raise ValueError(
            f"Gaussian params need an even last dim (mean, log_std), got {params.shape}"
        )
    mean, log_std = params.chunk(2, dim=-1)
    return mean, log_std


def gaussian_log_prob(params: Tensor, actions: Tensor) -> Tensor:
    """``log N(actions; mean, diag(std^2))`` summed over the action dims: ``[...]`` for
    ``params [..., 2A]`` and ``actions [..., A]``."""
    mean, log_std = split_params(params)
    z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(dim=-1)


def gaussian_entropy(params: Tensor) -> Tensor:
    """The entropy ``sum_j (0.5 + 0.5 log(2 pi) + log std_j)`` of the diagonal Gaussian,
    ``[...]``."""
    _, log_std = split_params(params)
    return (log_std + 0.5 + 0.5 * LOG_2PI).sum(dim=-1)


def gaussian_kl(p: Tensor, q: Tensor) -> Tensor:
    """``KL(p || q)`` of two diagonal Gaussians given by their params, summed over the dims::

    sum_j log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2
    """
    mp, lp = split_params(p)
    mq, lq = split_params(q)
    return (lq - lp + (torch.exp(2 * lp) + (mp - mq).square()) / (2 * torch.exp(2 * lq)) - 0.5).sum(
        dim=-1
    )


def categorical_entropy(logits: Tensor) -> Tensor:
    """Entropy ``H = -sum_a p_a log p_a`` of softmax(logits) over the last axis.

    ``-inf`` logits (masked actions) contribute 0 rather than NaN, as in
    ``torch.distributions.Categorical``.
    """
    log_probs = F.log_softmax(logits, dim=-1)
    log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def categorical_log_prob(logits: Tensor, actions: Tensor) -> Tensor:
    """``log softmax(logits)[action]``: ``[...]`` for ``logits [..., A]`` and ``actions [...]``."""
    return F.log_softmax(logits, dim=-1).gather(-1, actions.long().unsqueeze(-1))[..., 0]


@dataclass(frozen=True)
class ActionDistribution:
    """How a policy-gradient learner scores actions from the model's params ("logits")."""

    name: str
    continuous: bool
    """Actions are float vectors ``[..., A]`` (else integer indices ``[...]``)."""

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        """The log-probability (density) of the taken ``actions``, summed over action dims."""
        if self.continuous:
            return gaussian_log_prob(params, actions)
        return categorical_log_prob(params, actions)

    def entropy(self, params: Tensor) -> Tensor:
        """The policy's entropy at each step (summed over action dims)."""
        if self.continuous:
            return gaussian_entropy(params)
        return categorical_entropy(params)


CATEGORICAL = ActionDistribution("categorical", continuous=False)
DIAG_GAUSSIAN = ActionDistribution("diag_gaussian", continuous=True)


def distribution_of(model: Any) -> ActionDistribution:
    """The action distribution of a model's ``policy_logits``: the model's ``distribution``,
    else categorical (every discrete-action model of zrl, a user's model)."""
    dist = getattr(model, "distribution", CATEGORICAL)
    return dist if isinstance(dist, ActionDistribution) else CATEGORICAL


def check_distribution(model: Any, action_space: gym.spaces.Space) -> None:
    """ValueError unless the model's distribution fits the action space: a Box needs
    :data:`DIAG_GAUSSIAN` (a model of one's own for Box actions sets ``distribution =
    DIAG_GAUSSIAN`` and gives ``policy_logits [B, 2A]``: mean, log-std), a Discrete a
    categorical."""
    box = isinstance(action_space, gym.spaces.Box)
    if box != distribution_of(model).continuous:
        raise ValueError(
            f"the model {type(model).__name__} has a {distribution_of(model).name} policy and "
            f"the env's actions are {action_space!r}: a Box needs distribution = "
            "zrl.nets.gaussian.DIAG_GAUSSIAN and policy params [B, 2A] (mean, log-std)"
        )


class GaussianActorCritic(nn.Module):
    """Diagonal Gaussian policy with a state-independent log-std and a state-value function
    (see the module docstring). ``obs [B, *obs_shape]`` -> ``(params [B, 2A], value [B])``."""

    distribution = DIAG_GAUSSIAN
    action_low: Tensor
    action_high: Tensor

    def __init__(
        self,
        obs_shape: Sequence[int],
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        action_low: ArrayLike | None = None,
        action_high: ArrayLike | None = None,
        log_std_init: float = 0.0,
        encoder: ImageEncoder | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_shape = tuple(int(n) for n in obs_shape)
        self.obs_dim = math.prod(self.obs_shape)
        if self.obs_dim < 1 or act_dim < 1:
            raise ValueError(
                f"obs_dim and act_dim must be >= 1, got obs_dim={self.obs_dim}, act_dim={act_dim}"
            )
        if any(width < 1 for width in hidden):
            raise ValueError(f"hidden widths must be >= 1, got hidden={tuple(hidden)}")
        self.act_dim = act_dim
        self.encoder = encoder
        """An image encoder both torsos read (None: they read the flat observation)."""
        in_dim = self.obs_dim if encoder is None else encoder.out_features
        self.policy_torso = MLPEncoder((in_dim,), hidden, activation)
        self.policy_head = nn.Linear(self.policy_torso.out_features, act_dim)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        self.value_torso = MLPEncoder((in_dim,), hidden, activation)
        self.value_head = nn.Linear(self.value_torso.out_features, 1)
        init_actor_critic([self.policy_torso, self.value_torso], self.policy_head, self.value_head)
        low, high = _bounds(act_dim, action_low, action_high)
        self.register_buffer("action_low", torch.tensor(low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(high, dtype=torch.float32))
        self.normalizer: InputNormalizer | None = None
        """The observation normalizer (``model.normalize_input``, :meth:`add_normalizer`)."""

    def add_normalizer(self) -> None:
        """Normalize the flattened observations by running statistics from now on."""
        self.normalizer = InputNormalizer((self.obs_dim,))

    def features(self, obs: Tensor) -> Tensor:
        """The float ``[B, obs_dim]`` both torsos read (normalized with a normalizer), or the
        image encoder's features of ``obs``."""
        if self.encoder is not None:
            return self.encoder(obs)  # type: ignore[no-any-return]
        x = obs.reshape(obs.shape[0], -1)
        x = x if x.dtype == torch.float32 else x.float()
        return x if self.normalizer is None else self.normalizer(x)

    def params_of(self, x: Tensor) -> Tensor:
        mean = self.policy_head(self.policy_torso(x))
        return torch.cat([mean, self.log_std.expand_as(mean)], dim=-1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(params [B, 2A] = [mean, log_std], value [B])``."""
        x = self.features(obs)
        return self.params_of(x), self.value_head(self.value_torso(x))[:, 0]

    def policy_logits(self, obs: Tensor) -> Tensor:
        """The policy's params ``[B, 2A]`` alone: actors need no value."""
        return self.params_of(self.features(obs))

    def value(self, obs: Tensor) -> Tensor:
        """``V(obs)``, ``[B]``."""
        return self.value_head(self.value_torso(self.features(obs)))[:, 0]  # type: ignore[no-any-return]

    def clip(self, actions: Tensor) -> Tensor:
        """``actions`` clipped to the Box: what the env is stepped with."""
        return torch.clamp(actions, min=self.action_low, max=self.action_high)

    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[B, A]`` in the Box: the mean (``deterministic``) or a sample, clipped."""
        mean, log_std = split_params(self.policy_logits(obs))
        if deterministic:
            return self.clip(mean)
        return self.clip(mean + torch.exp(log_std) * torch.randn_like(mean))


def check_box(action_space: gym.spaces.Space) -> gym.spaces.Box:
    """The 1-D ``Box`` action space with finite bounds; ValueError naming it otherwise."""
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(
            f"unsupported action space {action_space!r}: the Gaussian policy needs a 1-D Box"
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ValueError(
            f"unsupported action space {action_space!r}: the Gaussian policy clips actions to "
            "the Box, which needs finite bounds"
        )
    return action_space


def gaussian_actor_critic_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> GaussianActorCritic:
    """zrl's Gaussian actor-critic for a ``Box`` observation space and a 1-D ``Box`` action
    space, feed-forward (``model.core: none``): MLPs over flat observations (``model.encoder``
    auto or mlp), a CNN first over ``[C, H, W]`` images (auto: ``nature_cnn``)."""
    box = check_box(action_space)
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: zrl models need a Box"
        )
    if model_cfg.core != "none":
        raise ValueError(
            f"model.core: {model_cfg.core}: the Gaussian policy (Box actions) is feed-forward; "
            "set model.core: none"
        )
    shape = tuple(observation_space.shape)
    kind = resolve_encoder(model_cfg.encoder, shape)
    images = len(shape) == 3
    if images == (kind == "mlp"):
        raise ValueError(
            f"model.encoder: {model_cfg.encoder}: the Gaussian policy (Box actions) reads "
            f"{shape} observations {'through a CNN' if images else 'through MLPs'}; set "
            f"model.encoder: {'nature_cnn or impala_resnet' if images else 'mlp'} (or auto)"
        )
    encoder = cast(ImageEncoder, build_encoder(kind, observation_space)) if images else None
    return GaussianActorCritic(
        shape,
        int(box.shape[0]),
        model_cfg.hidden,
        model_cfg.activation,
        box.low,
        box.high,
        encoder=encoder,
    )


def policy_model_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> nn.Module:
    """The network of PPO, IMPALA and APPO (``Algorithm.model``), from the env's action space:
    the Gaussian actor-critic for a ``Box``, the categorical one (recurrent with
    ``model.core``, ``zrl.nets.recurrent.actor_critic_for``) for a ``Discrete``."""
    if isinstance(action_space, gym.spaces.Box):
        return gaussian_actor_critic_for(observation_space, action_space, model_cfg)
    from zrl.nets.recurrent import actor_critic_for

    return actor_critic_for(observation_space, action_space, model_cfg)
