"""The observation of one agent's slot, and how an agent's PettingZoo observation becomes it.

A slot's observation is one float32 vector: the agent's own observation (flattened), then its
action mask (1 legal, 0 illegal) when the env gives one, then the env's global state when
``central_value`` asks for it. :class:`AgentObservationSpace` records the three sizes, so
zrl's actor-critic (``zrl.nets.discrete``) masks its logits and gives the state only to its critic.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np


class AgentObservationSpace(gym.spaces.Box):
    """A ``Box`` of ``features + mask + state`` float32 values, with the three sizes."""

    def __init__(self, feature_shape: tuple[int, ...], mask: int, state: int) -> None:
        self.feature_shape = tuple(int(n) for n in feature_shape)
        self.features = math.prod(self.feature_shape)
        self.mask = int(mask)
        self.state = int(state)
        size = self.features + self.mask + self.state
        super().__init__(-np.inf, np.inf, (size,), np.float32)

    def __reduce__(self) -> tuple[Any, ...]:
        return (AgentObservationSpace, (self.feature_shape, self.mask, self.state))

    def __repr__(self) -> str:
        return (
            f"AgentObservationSpace(features={self.feature_shape}, mask={self.mask}, "
            f"state={self.state})"
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, AgentObservationSpace)
            and self.feature_shape == other.feature_shape
            and (self.mask, self.state) == (other.mask, other.state)
        )

    def __hash__(self) -> int:
        return hash((self.feature_shape, self.mask, self.state))

    def split(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``obs [B, size]`` -> (own observations ``[B, *feature_shape]``, masks ``[B, mask]``
        as bool, or None without masks)."""
        own = obs[:, : self.features].reshape(len(obs), *self.feature_shape)
        if not self.mask:
            return own, None
        return own, obs[:, self.features : self.features + self.mask] > 0.5


def agent_space(
    observation_space: gym.Space, state_space: gym.Space | None
) -> AgentObservationSpace:
    """The slot space for an agent's PettingZoo ``observation_space`` (a Box, or a Dict of
    ``observation`` and ``action_mask``) and the global ``state_space`` (None: no state)."""
    if isinstance(observation_space, gym.spaces.Dict) and "action_mask" in observation_space.spaces:
        own = observation_space["observation"]
        mask = int(np.prod(observation_space["action_mask"].shape or ()))
    else:
        own, mask = observation_space, 0
    if not isinstance(own, gym.spaces.Box):
        raise ValueError(f"agent observation space {observation_space} is not a Box")
    state = 0 if state_space is None else int(np.prod(state_space.shape or ()))
    return AgentObservationSpace(tuple(own.shape), mask, state)


def encode(raw: Any, space: AgentObservationSpace, state: np.ndarray | None = None) -> np.ndarray:
    """One agent's PettingZoo observation (and the global state) as its slot's vector."""
    out = np.empty(space.shape, np.float32)
    if space.mask:
        out[: space.features] = np.asarray(raw["observation"]).ravel()
        out[space.features : space.features + space.mask] = np.asarray(raw["action_mask"]).ravel()
    else:
        out[: space.features] = np.asarray(raw).ravel()
    if space.state:
        assert state is not None
        out[space.features + space.mask :] = np.asarray(state).ravel()
    return out
