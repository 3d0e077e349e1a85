"""Partially observable control envs: classic tasks with their velocities hidden.

``zrl/CartPoleNoVel-v1`` is CartPole-v1 whose observation is only the cart position and the
pole angle (rl-baselines3-zoo's ``CartPoleNoVel-v1``): the velocities must be inferred from
past observations, so a feed-forward policy cannot balance it for long and a recurrent one
can. ``zrl/PendulumNoVel-v1`` is Pendulum-v1 without the angular velocity (cos, sin of the
angle). Both are registered when ``zrl.envs.vector`` is imported.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MaskVelocity(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Keep only the observation entries ``keep`` (the positions) of a Box observation."""

    def __init__(self, env: gym.Env[np.ndarray, Any], keep: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and space.shape is not None
        self.keep = np.asarray(keep, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep], high=space.high[self.keep], dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[self.keep]


def cartpole_no_velocity(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """CartPole-v1 observing (cart position, pole angle)."""
    return MaskVelocity(gym.make("CartPole-v1", **kwargs), keep=(0, 2))


def pendulum_no_velocity(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """Pendulum-v1 observing (cos, sin) of the angle."""
    return MaskVelocity(gym.make("Pendulum-v1", **kwargs), keep=(0, 1))


ENVS = {
    "zrl/CartPoleNoVel-v1": cartpole_no_velocity,
    "zrl/PendulumNoVel-v1": pendulum_no_velocity,
}


def register() -> None:
    """Register the ids of ``ENVS`` with gymnasium (once)."""
    for env_id, entry_point in ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point)
