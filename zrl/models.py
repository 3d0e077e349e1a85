"""Neural networks and their (de)serialization to plain numpy arrays for shipping weights."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn


def mlp(in_dim: int, hidden: Sequence[int]) -> nn.Sequential:
    """``Linear -> ReLU`` for each width in ``hidden``; empty ``hidden`` is the identity."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers)


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
        if obs_dim < 1 or num_actions < 1:
            raise ValueError(
                f"obs_dim and num_actions must be >= 1, got obs_dim={obs_dim}, "
                f"num_actions={num_actions}"
            )
        if any(width < 1 for width in hidden):
            raise ValueError(f"hidden widths must be >= 1, got hidden={tuple(hidden)}")
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


def build_q_network(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int] = (64, 64),
    dueling: bool = True,
) -> QNetwork:
    """QNetwork for a ``Box`` observation space (flattened) and a ``Discrete`` action space."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: QNetwork needs a Box"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"unsupported action space {action_space!r}: QNetwork needs a Discrete")
    if int(action_space.start) != 0:
        # The network outputs indices 0..n-1; a shifted space would need every actor to offset.
        raise ValueError(f"unsupported action space {action_space!r}: Discrete start must be 0")
    obs_dim = math.prod(observation_space.shape)
    return QNetwork(obs_dim, int(action_space.n), hidden=hidden, dueling=dueling)


def model_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """``state_dict`` as contiguous CPU numpy copies (safe to ship while training continues)."""
    return {
        name: np.array(tensor.detach().cpu().numpy(), copy=True, order="C")
        for name, tensor in model.state_dict().items()
    }


def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Inverse of :func:`model_to_arrays`: load every entry of ``model.state_dict()``.

    All keys and shapes are checked before anything is written, so a bad ``arrays`` raises
    ``ValueError`` (naming missing/unexpected keys or the mismatched shape) and leaves
    ``model`` untouched.
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
        if not array.flags.writeable:
            # Arrays decoded straight from a message buffer are read-only; torch warns on those.
            array = array.copy()
        tensors[name] = torch.from_numpy(array)
    model.load_state_dict(tensors, strict=True)


def build_model(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    hidden: Sequence[int],
    dueling: bool,
    model_fn: Callable[..., nn.Module] | None = None,
) -> nn.Module:
    """The user's model (``model_fn(observation_space, action_space)``) or zrl's QNetwork."""
    if model_fn is None:
        return build_q_network(observation_space, action_space, hidden, dueling)
    model = model_fn(observation_space, action_space)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"the model factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model
