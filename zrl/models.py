"""Neural networks and their (de)serialization to plain numpy arrays for shipping weights."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zrl.algos import get_algorithm
from zrl.config import ModelConfig

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu") -> nn.Sequential:
    """``Linear -> activation`` for each width in ``hidden``; empty ``hidden`` is the identity."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers)


def check_sizes(obs_dim: int, num_actions: int, hidden: Sequence[int]) -> None:
    """ValueError naming the value unless every size of a discrete-action network is >= 1."""
    if obs_dim < 1 or num_actions < 1:
        raise ValueError(
            f"obs_dim and num_actions must be >= 1, got obs_dim={obs_dim}, "
            f"num_actions={num_actions}"
        )
    if any(width < 1 for width in hidden):
        raise ValueError(f"hidden widths must be >= 1, got hidden={tuple(hidden)}")


class QNetwork(nn.Module):
    """MLP Q-network, optionally with a dueling head (Wang et al. 2016).

    Dueling: ``Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')``. Centring the advantages makes the
    V/A split identifiable (``mean_a Q(s, a) = V(s)``) without changing the greedy action.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        dueling: bool = True,
    ) -> None:
        super().__init__()
        check_sizes(obs_dim, num_actions, hidden)
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.dueling = dueling
        self.torso = mlp(obs_dim, hidden)
        features = hidden[-1] if len(hidden) > 0 else obs_dim
        self.advantage_head = nn.Linear(features, num_actions)
        self.value_head: nn.Linear | None = nn.Linear(features, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        """``obs [B, obs_dim]`` (or ``[B, *obs_shape]``, flattened) -> ``q [B, num_actions]``."""
        if not obs.is_floating_point():
            obs = obs.float()
        x = self.torso(obs.flatten(start_dim=1))
        advantages = self.advantage_head(x)
        if self.value_head is None:
            return advantages
        return self.value_head(x) + advantages - advantages.mean(dim=1, keepdim=True)


class ActorCritic(nn.Module):
    """Categorical policy and state-value function as two separate MLPs.

    Separate torsos, as CleanRL and SB3 use for small control tasks: a shared torso lets the
    value loss, whose scale grows with the returns, swamp the policy gradient. Orthogonal
    initialisation with a 0.01-gain policy head starts from a near-uniform policy.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        check_sizes(obs_dim, num_actions, hidden)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        features = hidden[-1] if len(hidden) > 0 else obs_dim
        self.policy_torso = mlp(obs_dim, hidden, activation)
        self.policy_head = nn.Linear(features, num_actions)
        self.value_torso = mlp(obs_dim, hidden, activation)
        self.value_head = nn.Linear(features, 1)
        for module in (*self.policy_torso, *self.value_torso):
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, math.sqrt(2))
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.policy_head.weight, 0.01)
        nn.init.zeros_(self.policy_head.bias)
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``obs [B, obs_dim]`` -> ``(logits [B, num_actions], value [B])``."""
        x = obs.float().flatten(start_dim=1)
        return self.policy_head(self.policy_torso(x)), self.value_head(self.value_torso(x))[:, 0]

    def policy_logits(self, obs: Tensor) -> Tensor:
        """The policy's logits ``[B, num_actions]`` alone: actors need no value."""
        return self.policy_head(self.policy_torso(obs.float().flatten(start_dim=1)))  # type: ignore[no-any-return]

    def value(self, obs: Tensor) -> Tensor:
        """``V(obs)``, ``[B]``."""
        return self.value_head(self.value_torso(obs.float().flatten(start_dim=1)))[:, 0]

    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[B]``: sampled from the policy, or its mode when ``deterministic``."""
        logits = self.policy_logits(obs)
        if deterministic:
            return logits.argmax(dim=1)
        return torch.distributions.Categorical(logits=logits).sample()


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
    the model has ``act`` (actor-critics), else the argmax of its Q-values."""
    act = getattr(model, "act", None)
    if callable(act):
        return act(obs, deterministic=True)  # type: ignore[no-any-return]
    return model(obs).argmax(dim=1)  # type: ignore[no-any-return]


def _check_spaces(observation_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: zrl models need a Box"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"unsupported action space {action_space!r}: this model needs a Discrete")
    if int(action_space.start) != 0:
        # The network outputs indices 0..n-1; a shifted space would need every actor to offset.
        raise ValueError(f"unsupported action space {action_space!r}: Discrete start must be 0")


def build_actor_critic(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
) -> ActorCritic:
    """ActorCritic for a ``Box`` observation space (flattened) and a ``Discrete`` action space."""
    _check_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    obs_dim = math.prod(observation_space.shape or ())
    return ActorCritic(obs_dim, int(action_space.n), hidden, activation)


def build_q_network(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int] = (64, 64),
    dueling: bool = True,
) -> QNetwork:
    """QNetwork for a ``Box`` observation space (flattened) and a ``Discrete`` action space."""
    _check_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    obs_dim = math.prod(observation_space.shape or ())
    return QNetwork(obs_dim, int(action_space.n), hidden=hidden, dueling=dueling)


def model_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """``state_dict`` as contiguous CPU numpy copies (safe to ship while training continues)."""
    return {
        name: np.array(tensor.detach().cpu().numpy(), copy=True, order="C")
        for name, tensor in model.state_dict().items()
    }


def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Inverse of :func:`model_to_arrays`: load every entry of ``model.state_dict()``.

    All keys, shapes and values are checked before anything is written, so a bad ``arrays``
    raises ``ValueError`` (naming missing/unexpected keys, the mismatched shape or the entry
    holding NaN/inf) and leaves ``model`` untouched.
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(arrays))
    unexpected = sorted(set(arrays) - set(expected))
    if missing or unexpected:
        raise ValueError(f"load_arrays: missing keys {missing}, unexpected keys {unexpected}")
    tensors: dict[str, Tensor] = {}
    for name, current in expected.items():
        array = np.asarray(arrays[name])
        if array.shape != tuple(current.shape):
            raise ValueError(
                f"load_arrays: shape mismatch for {name!r}: got {array.shape}, "
                f"model has {tuple(current.shape)}"
            )
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            # One NaN in published weights poisons every action until the next good version.
            raise ValueError(f"load_arrays: {name!r} holds NaN or inf values")
        if not array.flags.writeable:
            # Arrays decoded straight from a message buffer are read-only; torch warns on those.
            array = array.copy()
        tensors[name] = torch.from_numpy(array)
    model.load_state_dict(tensors, strict=True)


def q_network_for(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    twin: bool = False,
) -> QNetwork:
    """zrl's network for Q-learning algorithms (``Algorithm.model``)."""
    return build_q_network(observation_space, action_space, model_cfg.hidden, model_cfg.dueling)


def actor_critic_for(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    twin: bool = False,
) -> ActorCritic:
    """zrl's network for the actor-critics (``Algorithm.model``)."""
    return build_actor_critic(
        observation_space, action_space, model_cfg.hidden, model_cfg.activation
    )


def build_model(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    algo: str = "apex_dqn",
    model_fn: Callable[..., nn.Module] | None = None,
    twin: bool = False,
) -> nn.Module:
    """The user's model (``model_fn(observation_space, action_space)``) or zrl's network for
    ``algo``: a QNetwork for apex_dqn, an ActorCritic for impala, appo, a3c and ppo, a DDPGModel
    (with a second critic if ``twin``, i.e. ``ddpg.twin``) for apex_ddpg, a SACModel for sac."""
    if model_fn is None:
        algorithm = get_algorithm(algo)
        return algorithm.load(algorithm.model)(  # type: ignore[no-any-return]
            observation_space, action_space, model_cfg, twin
        )
    model = model_fn(observation_space, action_space)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"the model factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model
