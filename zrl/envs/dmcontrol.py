"""DeepMind Control Suite through shimmy (``pip install -e ".[dm_control]"``): state
observations as one float32 vector.

``make_vector_env`` sends ids in shimmy's ``dm_control`` namespace
(``dm_control/cartpole-balance-v0``, ``dm_control/walker-walk-v0``) here. The suite's
observation is a Dict of float64 arrays (cartpole: ``position`` [3], ``velocity`` [2]);
``FlatState`` concatenates them in the Dict's order (``gymnasium.spaces.flatten``) as float32,
which zrl's MLPs and replay take. Actions are a Box in [-1, 1] (the Gaussian PPO/APPO and SAC
paths). An episode is 1000 control steps; the suite's rewards are in [0, 1] per step, so
returns are in [0, 1000]. Pixel observations (``render_mode="rgb_array"``) are not wired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError, copies_of

DM_CONTROL_INSTALL = 'pip install -e ".[dm_control]"'
NAMESPACE = "dm_control"


def is_dm_control(env_id: str) -> bool:
    """Whether ``env_id`` is in shimmy's ``dm_control`` namespace."""
    return env_id.split(":")[-1].startswith(f"{NAMESPACE}/")


def require_dm_control(env_id: str) -> None:
    """Import shimmy and dm_control and register shimmy's ids; an EnvError with the install
    line if either is not installed."""
    try:
        import dm_control  # noqa: F401 - shimmy registers the suite only when it imports
        import shimmy
    except ImportError:
        raise EnvError(f"{env_id!r} needs dm-control and shimmy: {DM_CONTROL_INSTALL}") from None
    if not any(spec.namespace == NAMESPACE for spec in gym.registry.values()):
        gym.register_envs(shimmy)


class FlatState(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """A dm_control env's Dict of state arrays as one float32 vector."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.dict_space = env.observation_space
        flat = gym.spaces.flatten_space(self.dict_space)
        assert isinstance(flat, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(
            low=-np.inf, high=np.inf, shape=flat.shape, dtype=np.float32
        )

    def observation(self, observation: Any) -> np.ndarray:
        flat = gym.spaces.flatten(self.dict_space, observation)
        return np.asarray(flat, dtype=np.float32)


def make_dm_control_env(cfg: EnvConfig) -> gym.Env[np.ndarray, Any]:
    """One dm_control env of ``cfg.id`` (with ``cfg.kwargs``) with ``FlatState`` observations;
    an EnvError naming the versions when dm_control cannot load its physics with the installed
    ``mujoco`` (each dm-control release is built against one MuJoCo release)."""
    require_dm_control(cfg.id)
    try:
        env = gym.make(cfg.id, **cfg.kwargs)
    except AttributeError as exc:
        from importlib.metadata import version

        raise EnvError(
            f"{cfg.id!r}: dm-control {version('dm-control')} cannot load its physics with "
            f"mujoco {version('mujoco')} ({exc}); install the mujoco release that dm-control "
            "was built for"
        ) from None
    return FlatState(env)


def make_dm_control_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``make_dm_control_env`` (NEXT_STEP autoreset): ``sync`` for
    ``auto``/``native`` (the suite has no vectorized form)."""
    mode = cfg.vectorization
    if mode == "envpool":
        raise EnvError(f"vectorization envpool is for Atari ids only, not {cfg.id!r}")
    require_dm_control(cfg.id)
    make_dm_control_env(cfg).close()  # fail here, in this process, with the versions
    env_fn: Callable[[], gym.Env[Any, Any]] = lambda: make_dm_control_env(cfg)  # noqa: E731
    return copies_of(env_fn, num_envs, mode, f"dm_control environment {cfg.id!r}")
