"""Games of random legal moves against a fixed player in a real multi-agent env."""

from __future__ import annotations

import numpy as np

from zrl.config.multiagent import MultiAgentConfig
from zrl.envs.multiagent.envs import fixed_opponents, make_multiagent_vector_env


def play_random_against(env_id: str, opponent: str, games: int) -> np.ndarray:
    """Win/draw/loss counts of random legal moves against ``opponent`` in the real env (the
    random slot moving first in half the games)."""
    env = make_multiagent_vector_env(env_id, {}, MultiAgentConfig(opponent=opponent), games)
    fixed = fixed_opponents(env, opponent, seed=1)
    env.opponents = fixed
    rng = np.random.default_rng(0)
    try:
        obs, _ = env.reset(seed=0)
        done = np.zeros(env.num_envs, bool)
        while not done.all():
            _, mask = env.single_observation_space.split(obs)
            actions = np.where(mask, rng.random(mask.shape), -1.0).argmax(axis=1)
            obs, _, terminated, truncated, _ = env.step(actions)
            done |= terminated | truncated
    finally:
        env.close()
    return fixed.results[opponent]
