"""Networks for discrete action spaces: Q-networks, categorical actor-critics, acting with them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zrl.config.sections import ModelConfig
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.encoders import (
    ACTIVATIONS,
    MLPEncoder,
    NatureCNN,
    build_encoder,
    resolve_encoder,
)

ORTHOGONAL = (MLPEncoder, NatureCNN)
"""The torsos an ActorCritic initialises orthogonally."""


def check_sizes(obs_dim: int, num_actions: int, hidden: Sequence[int]) -> None:
    """ValueError naming the value unless every size of a discrete-action network is >= 1."""
    if obs_dim < 1 or num_actions < 1:
        raise ValueError(
            f"obs_dim and num_actions must be >= 1, got obs_dim={obs_dim}, "
            f"num_actions={num_actions}"
        )
    if any(width < 1 for width in hidden):
        raise ValueError(f"hidden widths must be >= 1, got hidden={tuple(hidden)}")


def _encoder_sizes(
    encoder: nn.Module, obs_dim: int | None, num_actions: int
) -> tuple[tuple[int, ...], int]:
    """``(obs_shape, out_features)`` of an encoder, its shape checked against ``obs_dim``."""
    shape = getattr(encoder, "obs_shape", None)
    features = getattr(encoder, "out_features", None)
    if shape is None or not isinstance(features, int):
        raise ValueError(
            f"encoder {type(encoder).__name__} needs obs_shape and out_features attributes"
        )
    obs_shape = tuple(int(n) for n in shape)
    if obs_dim is not None and obs_dim != math.prod(obs_shape):
        raise ValueError(f"obs_dim={obs_dim} does not match the encoder's shape {obs_shape}")
    check_sizes(math.prod(obs_shape), num_actions, ())
    return obs_shape, features


class QNetwork(nn.Module):
    """Q-network: an encoder (``torso``: the MLP by default, or a CNN for images) and a
    linear head, optionally dueling (Wang et al. 2016).

    Dueling: ``Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')``. Centring the advantages makes the
    V/A split identifiable (``mean_a Q(s, a) = V(s)``) without changing the greedy action.
    Without ``encoder`` the torso is the ``hidden`` MLP over ``obs_dim`` inputs; with one
    (see :func:`zrl.nets.encoders.build_encoder`) ``obs_dim`` may be None and ``hidden`` is unused.
    """

    def __init__(
        self,
        obs_dim: int | None,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        dueling: bool = True,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if encoder is None:
            check_sizes(obs_dim or 0, num_actions, hidden)
            assert obs_dim is not None
            encoder = MLPEncoder((obs_dim,), hidden)
        self.obs_shape, features = _encoder_sizes(encoder, obs_dim, num_actions)
        self.obs_dim = math.prod(self.obs_shape)
        self.num_actions = num_actions
        self.dueling = dueling
        self.torso = encoder
        self.advantage_head = nn.Linear(features, num_actions)
        self.value_head: nn.Linear | None = nn.Linear(features, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        """``obs [B, *obs_shape]`` (or flattened, ``[B, obs_dim]``) -> ``q [B, num_actions]``."""
        x = self.torso(obs)
        advantages = self.advantage_head(x)
        if self.value_head is None:
            return advantages  # type: ignore[no-any-return]
        return self.value_head(x) + advantages - advantages.mean(dim=1, keepdim=True)


def init_actor_critic(
    torsos: Sequence[nn.Module], policy_head: nn.Linear, value_head: nn.Linear
) -> None:
    """CleanRL's PPO initialisation: orthogonal sqrt(2) torsos, a 0.01-gain policy head (a
    near-uniform first policy) and a unit-gain value head, zero biases."""
    for module in (sub for torso in torsos for sub in torso.modules()):
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(module.weight, math.sqrt(2))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    nn.init.orthogonal_(policy_head.weight, 0.01)
    nn.init.zeros_(policy_head.bias)
    nn.init.orthogonal_(value_head.weight, 1.0)
    nn.init.zeros_(value_head.bias)


class CategoricalActorCritic(nn.Module):
    """What zrl's actor-critics share: ``act`` from their ``policy_logits``."""

    def policy_logits(self, obs: Tensor) -> Tensor:
        raise NotImplementedError

    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[B]``: sampled from the policy, or its mode when ``deterministic``."""
        logits = self.policy_logits(obs)
        if deterministic:
            return logits.argmax(dim=1)
        return torch.distributions.Categorical(logits=logits).sample()


class ActorCritic(CategoricalActorCritic):
    """Categorical policy and state-value function: two separate MLPs, or one shared encoder.

    Without ``encoder``: separate ``hidden`` MLP torsos, as CleanRL and SB3 use for small
    control tasks (a shared torso lets the value loss, whose scale grows with the returns,
    swamp the policy gradient). With one (a CNN for images, see
    :func:`zrl.nets.encoders.build_encoder`): one ``torso`` feeding both heads, as IMPALA and
    Sample Factory do on Atari. Orthogonal initialisation with a 0.01-gain policy head starts
    from a near-uniform policy.
    """

    def __init__(
        self,
        obs_dim: int | None,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.shared = encoder is not None
        if encoder is None:
            check_sizes(obs_dim or 0, num_actions, hidden)
            assert obs_dim is not None
            mlp_torso = MLPEncoder((obs_dim,), hidden, activation)
            policy_torso: nn.Module = mlp_torso
            value_torso: nn.Module = MLPEncoder((obs_dim,), hidden, activation)
            encoder = nn.Identity()
            self.obs_shape: tuple[int, ...] = (obs_dim,)
            features = mlp_torso.out_features
        else:
            self.obs_shape, features = _encoder_sizes(encoder, obs_dim, num_actions)
            policy_torso, value_torso = nn.Identity(), nn.Identity()
        self.obs_dim = math.prod(self.obs_shape)
        self.num_actions = num_actions
        # Registered in this order so the MLP's state_dict keys stay those of earlier versions
        # (the Identity modules hold no state).
        self.torso = encoder
        self.policy_torso = policy_torso
        self.policy_head = nn.Linear(features, num_actions)
        self.value_torso = value_torso
        self.value_head = nn.Linear(features, 1)
        # Orthogonal sqrt(2) init of the MLPs and the Nature CNN (CleanRL's PPO); the IMPALA
        # ResNet (and a user's encoder) keep their own: sqrt(2) gains compound through its
        # residual blocks (feature RMS 10 against 0.04 on random frames).
        torsos = [m for m in (encoder, policy_torso, value_torso) if isinstance(m, ORTHOGONAL)]
        init_actor_critic(torsos, self.policy_head, self.value_head)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``obs [B, *obs_shape]`` (or ``[B, obs_dim]``) ->
        ``(logits [B, num_actions], value [B])``."""
        x = self.torso(obs)  # the shared encoder, or the identity before separate MLPs
        return self.policy_head(self.policy_torso(x)), self.value_head(self.value_torso(x))[:, 0]

    def policy_logits(self, obs: Tensor) -> Tensor:
        """The policy's logits ``[B, num_actions]`` alone: actors need no value."""
        return self.policy_head(self.policy_torso(self.torso(obs)))  # type: ignore[no-any-return]

    def value(self, obs: Tensor) -> Tensor:
        """``V(obs)``, ``[B]``."""
        return self.value_head(self.value_torso(self.torso(obs)))[:, 0]


ILLEGAL_LOGIT = -1e9
"""The logit of an action the mask forbids: finite, so log-probabilities and entropies stay
finite, and far enough below any real logit that its probability is exactly 0 in float32."""


class AgentActorCritic(CategoricalActorCritic):
    """The actor-critic of a multi-agent slot (:class:`AgentObservationSpace`): the policy MLP
    reads the agent's own observation and its logits of illegal actions are set to
    ``ILLEGAL_LOGIT`` (never sampled, never the greedy action, no gradient through them); the
    value MLP reads the own observation and the global state (a centralised critic, MAPPO)
    when the slot carries one."""

    def __init__(
        self,
        space: AgentObservationSpace,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        check_sizes(space.features, num_actions, hidden)
        if space.mask and space.mask != num_actions:
            raise ValueError(f"the action mask has {space.mask} entries for {num_actions} actions")
        self.features, self.mask, self.state = space.features, space.mask, space.state
        self.obs_shape = tuple(space.shape)
        self.obs_dim = int(space.shape[0])
        self.num_actions = num_actions
        self.policy_torso = MLPEncoder((self.features,), hidden, activation)
        self.policy_head = nn.Linear(self.policy_torso.out_features, num_actions)
        self.value_torso = MLPEncoder((self.features + self.state,), hidden, activation)
        self.value_head = nn.Linear(self.value_torso.out_features, 1)
        init_actor_critic([self.policy_torso, self.value_torso], self.policy_head, self.value_head)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.policy_logits(obs), self.value(obs)

    def policy_logits(self, obs: Tensor) -> Tensor:
        # obs.shape[0], not len(obs): a traced export (zrl.nets.export) keeps the batch free.
        obs = obs.reshape(obs.shape[0], -1).float()
        logits = self.policy_head(self.policy_torso(obs[:, : self.features]))
        if not self.mask:
            return logits  # type: ignore[no-any-return]
        legal = obs[:, self.features : self.features + self.mask] > 0.5
        return torch.where(legal, logits, torch.full_like(logits, ILLEGAL_LOGIT))

    def value(self, obs: Tensor) -> Tensor:
        obs = obs.reshape(obs.shape[0], -1).float()
        own_and_state = torch.cat(
            [obs[:, : self.features], obs[:, self.features + self.mask :]], dim=1
        )
        return self.value_head(self.value_torso(own_and_state))[:, 0]


def policy_logits(model: nn.Module, obs: Tensor) -> Tensor:
    """Categorical logits ``[B, A]`` of an actor-critic: ``model.policy_logits(obs)`` where the
    model has it (half the forward pass of zrl's ActorCritic), else ``model(obs)[0]``."""
    only_policy = getattr(model, "policy_logits", None)
    if callable(only_policy):
        return only_policy(obs)  # type: ignore[no-any-return]
    return model(obs)[0]  # type: ignore[no-any-return]


def sample_categorical(logp: np.ndarray, gumbel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Actions drawn from the categoricals with log-probabilities ``logp [B, A]`` by the
    Gumbel-max trick, ``argmax(logp + g)`` with ``g ~ Gumbel(0, 1)`` of the same shape, and
    their log-probabilities ``[B]``.

    Exact sampling in numpy: an actor draws all its Gumbel noise for a trajectory at once
    instead of building a ``torch.distributions.Categorical`` per step (which took 3/4 of an
    on-policy actor's CPU on CartPole)."""
    actions = np.argmax(logp + gumbel, axis=1)
    return actions, np.take_along_axis(logp, actions[:, None], axis=1)[:, 0]


def greedy_actions(model: nn.Module, obs: Tensor) -> Tensor:
    """The deterministic action of any zrl model: ``model.act(obs, deterministic=True)`` where
    the model has ``act``, else the argmax of its Q-values, or of its logits for an
    actor-critic whose ``forward`` gives ``(logits, value)``."""
    act = getattr(model, "act", None)
    if callable(act):
        return act(obs, deterministic=True)  # type: ignore[no-any-return]
    out = model(obs)
    if isinstance(out, tuple):
        out = out[0]
    return out.argmax(dim=1)  # type: ignore[no-any-return]


def check_discrete_spaces(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space
) -> None:
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: zrl models need a Box"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"unsupported action space {action_space!r}: this model needs a Discrete")
    if int(action_space.start) != 0:
        # The network outputs indices 0..n-1; a shifted space would need every actor to offset.
        raise ValueError(f"unsupported action space {action_space!r}: Discrete start must be 0")


def _encoder_for(
    observation_space: gym.spaces.Space, kind: str, hidden: Sequence[int], activation: str
) -> nn.Module | None:
    """The encoder ``kind`` resolves to for the space, or None for the (flattening) MLP."""
    shape = tuple(observation_space.shape or ())
    if resolve_encoder(kind, shape) == "mlp":
        return None
    return build_encoder(kind, observation_space, hidden, activation)


def build_actor_critic(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    encoder: str = "auto",
) -> ActorCritic | AgentActorCritic:
    """ActorCritic for a ``Box`` observation space and a ``Discrete`` action space: separate
    MLPs over the flattened observation, or one shared CNN (``encoder``, see
    :func:`zrl.nets.encoders.build_encoder`; ``auto`` picks the Nature CNN for ``[C, H, W]``).
    A multi-agent slot with an action mask or a global state gets an AgentActorCritic."""
    check_discrete_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    if isinstance(observation_space, AgentObservationSpace) and (
        observation_space.mask or observation_space.state
    ):
        return AgentActorCritic(observation_space, int(action_space.n), hidden, activation)
    torso = _encoder_for(observation_space, encoder, hidden, activation)
    obs_dim = math.prod(observation_space.shape or ()) if torso is None else None
    return ActorCritic(obs_dim, int(action_space.n), hidden, activation, encoder=torso)


def build_q_network(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int] = (64, 64),
    dueling: bool = True,
    encoder: str = "auto",
) -> QNetwork:
    """QNetwork for a ``Box`` observation space and a ``Discrete`` action space: an MLP over
    the flattened observation, or a CNN (``encoder``, as in :func:`build_actor_critic`)."""
    check_discrete_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    torso = _encoder_for(observation_space, encoder, hidden, "relu")
    obs_dim = math.prod(observation_space.shape or ()) if torso is None else None
    return QNetwork(obs_dim, int(action_space.n), hidden, dueling, encoder=torso)


def q_network_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> QNetwork:
    """zrl's network for Q-learning algorithms (``Algorithm.model``)."""
    if isinstance(observation_space, AgentObservationSpace) and observation_space.mask:
        raise ValueError(
            "this env masks illegal actions and zrl's Q-networks do not: use an algorithm "
            "with an actor-critic model, whose policy masks them"
        )
    return build_q_network(
        observation_space, action_space, model_cfg.hidden, model_cfg.dueling, model_cfg.encoder
    )


def actor_critic_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> ActorCritic | AgentActorCritic:
    """zrl's network for the actor-critics (``Algorithm.model``)."""
    return build_actor_critic(
        observation_space, action_space, model_cfg.hidden, model_cfg.activation, model_cfg.encoder
    )
