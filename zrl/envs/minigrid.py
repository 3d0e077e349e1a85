"""MiniGrid (``minigrid``, ``pip install -e ".[minigrid]"``): grid worlds seen from the agent.

``make_vector_env`` sends ids of the form ``MiniGrid-<Task>-v<N>`` (``MiniGrid-Empty-5x5-v0``,
``MiniGrid-DoorKey-5x5-v0``) here. MiniGrid's observation is a Dict: ``image``, the 7x7 cells
in front of the agent as uint8 [7, 7, 3] (object index 0-10, colour index 0-5, door state
0-2), ``direction`` (0-3) and ``mission`` (a string). zrl's models take one array, so
``FlatImage`` keeps the image (minigrid's ``ImgObsWrapper``: the view is egocentric, the
direction adds little, the mission is constant in a task family) and flattens it to float32
[147]: the entries are category indices, not pixel intensities, so they go to the MLP (with
``model.normalize_input``) rather than to the uint8 path, where a [C, H, W] uint8 space would
be taken for a frame stack (``zrl.codecs.frames.is_frame_stack``) and scaled by 1/255.

The grid is partially observable (walls and doors hide what is behind them): a recurrent
model (``model.recurrent``) helps on the larger tasks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError, copies_of

MINIGRID_INSTALL = 'pip install -e ".[minigrid]"'
_MINIGRID = re.compile(r"^(BabyAI|MiniGrid)-[A-Za-z0-9-]+-v\d+$")


def is_minigrid(env_id: str) -> bool:
    """Whether ``env_id`` is a MiniGrid (or BabyAI) id: ``MiniGrid-Empty-5x5-v0``."""
    return _MINIGRID.match(env_id.split(":")[-1]) is not None


def require_minigrid(env_id: str) -> None:
    """Import minigrid, which registers its ids; an EnvError with the install line if it is
    not installed."""
    try:
        import minigrid  # noqa: F401 - importing it registers the MiniGrid ids
    except ImportError:
        raise EnvError(f"{env_id!r} needs minigrid: {MINIGRID_INSTALL}") from None


class FlatImage(gym.ObservationWrapper[np.ndarray, Any, dict[str, Any]]):
    """A MiniGrid env's ``image`` observation, flattened to float32 (the cells' object,
    colour and state indices, [H * W * 3]); ``direction`` and ``mission`` are dropped."""

    def __init__(self, env: gym.Env[dict[str, Any], Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Dict) or "image" not in space.spaces:
            raise EnvError(f"a MiniGrid env has a Dict observation with 'image', not {space}")
        image = space["image"]
        assert isinstance(image, gym.spaces.Box)
        size = int(np.prod(image.shape))
        self.observation_space = gym.spaces.Box(
            low=0.0, high=float(image.high.max()), shape=(size,), dtype=np.float32
        )

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        return np.asarray(observation["image"], dtype=np.float32).reshape(-1)


def make_minigrid_env(cfg: EnvConfig) -> gym.Env[np.ndarray, Any]:
    """One MiniGrid env of ``cfg.id`` (with ``cfg.kwargs``) with ``FlatImage`` observations."""
    require_minigrid(cfg.id)
    return FlatImage(gym.make(cfg.id, **cfg.kwargs))


def make_minigrid_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``make_minigrid_env`` (NEXT_STEP autoreset): ``sync`` for
    ``auto``/``native`` (MiniGrid has no vectorized form; a step costs microseconds)."""
    mode = cfg.vectorization
    if mode == "envpool":
        raise EnvError(f"vectorization envpool is for Atari ids only, not {cfg.id!r}")
    require_minigrid(cfg.id)
    env_fn: Callable[[], gym.Env[Any, Any]] = lambda: make_minigrid_env(cfg)  # noqa: E731
    return copies_of(env_fn, num_envs, mode, f"MiniGrid environment {cfg.id!r}")
