"""DeepMind Control Suite through shimmy (``pip install -e ".[dm_control]"``): state
observations as one float32 vector, or pixels.

``make_vector_env`` sends ids in shimmy's ``dm_control`` namespace
(``dm_control/cartpole-balance-v0``, ``dm_control/walker-walk-v0``) here. The suite's
observation is a Dict of float64 arrays (cartpole: ``position`` [3], ``velocity`` [2]);
``FlatState`` concatenates them in the Dict's order (``gymnasium.spaces.flatten``) as float32,
which zrl's MLPs and replay take. Actions are a Box in [-1, 1] (the Gaussian PPO/APPO and SAC
paths). An episode is 1000 control steps; the suite's rewards are in [0, 1] per step, so
returns are in [0, 1000].

Pixels (``env.kwargs.pixels``: ``true``, or a map of ``width``, ``height``, ``camera_id``,
``frames``; defaults 84, 84, 0, 3): ``PixelFrames`` renders each observation with MuJoCo
(headless, ``MUJOCO_GL=egl`` unless the environment says otherwise, set before dm_control is
imported) and stacks the last ``frames`` RGB frames along the channels: uint8
``[3 * frames, height, width]``, marked as one image (``zrl.envs.base.mark_single_image``:
its observations travel whole, as VizDoom's), which the CNN encoders take. The state is not
in the observation.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError, copies_of, mark_single_image

DM_CONTROL_INSTALL = 'pip install -e ".[dm_control]"'
NAMESPACE = "dm_control"
PIXEL_DEFAULTS = {"width": 84, "height": 84, "camera_id": 0, "frames": 3}
"""``env.kwargs.pixels``' keys and their defaults (DrQ's 84x84 and 3 frames)."""
MAX_PIXELS = 512
"""The largest width or height rendered."""


def is_dm_control(env_id: str) -> bool:
    """Whether ``env_id`` is in shimmy's ``dm_control`` namespace."""
    return env_id.split(":")[-1].startswith(f"{NAMESPACE}/")


def require_dm_control(env_id: str, pixels: bool = False) -> None:
    """Import shimmy and dm_control and register shimmy's ids; an EnvError with the install
    line if either is not installed. For ``pixels``, MuJoCo renders headless: ``MUJOCO_GL``
    defaults to ``egl``, which dm_control reads as it is imported."""
    if pixels:
        os.environ.setdefault("MUJOCO_GL", "egl")
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


class PixelFrames(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """A dm_control env (made with ``render_mode="rgb_array"``) observed through its camera:
    the last ``frames`` rendered RGB frames, channels first and stacked along the channels,
    uint8 ``[3 * frames, height, width]`` (the first frame repeated after a reset)."""

    def __init__(self, env: gym.Env[Any, Any], frames: int, height: int, width: int) -> None:
        super().__init__(env)
        self.frames: deque[np.ndarray] = deque(maxlen=frames)
        shape = (3 * frames, height, width)
        self.observation_space = mark_single_image(gym.spaces.Box(0, 255, shape, np.uint8))

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        _, info = self.env.reset(**kwargs)
        frame = self.frame()
        for _ in range(self.frames.maxlen or 1):
            self.frames.append(frame)
        return np.concatenate(self.frames), info

    def observation(self, observation: Any) -> np.ndarray:
        self.frames.append(self.frame())
        return np.concatenate(self.frames)

    def frame(self) -> np.ndarray:
        """The camera's RGB frame now, ``[3, height, width]``."""
        image = np.asarray(self.env.render(), dtype=np.uint8)
        return np.ascontiguousarray(image.transpose(2, 0, 1))


def pixel_settings(env_id: str, pixels: Any) -> dict[str, int] | None:
    """``env.kwargs.pixels`` checked: None (state observations) for false or absent, else the
    settings with defaults; an EnvError naming the bad key or value."""
    if pixels is None or pixels is False:
        return None
    if pixels is True:
        return dict(PIXEL_DEFAULTS)
    if not isinstance(pixels, dict):
        raise EnvError(
            f"{env_id!r}: env.kwargs.pixels must be true, false or a map, not {pixels!r}"
        )
    unknown = sorted(set(pixels) - set(PIXEL_DEFAULTS))
    if unknown:
        raise EnvError(
            f"{env_id!r}: env.kwargs.pixels: unknown key(s) {unknown} (known: "
            f"{', '.join(PIXEL_DEFAULTS)})"
        )
    settings = {**PIXEL_DEFAULTS, **pixels}
    for key, value in settings.items():
        low, high = (0, 16) if key == "camera_id" else (1, 16 if key == "frames" else MAX_PIXELS)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise EnvError(
                f"{env_id!r}: env.kwargs.pixels.{key} must be an integer in [{low}, {high}], "
                f"not {value!r}"
            )
    return settings


def make_dm_control_env(cfg: EnvConfig) -> gym.Env[np.ndarray, Any]:
    """One dm_control env of ``cfg.id`` (with ``cfg.kwargs``) with ``FlatState`` observations,
    or ``PixelFrames`` with ``env.kwargs.pixels``; an EnvError naming the versions when
    dm_control cannot load its physics with the installed ``mujoco`` (each dm-control release
    is built against one MuJoCo release), or saying how to render when MuJoCo cannot."""
    kwargs = dict(cfg.kwargs)
    pixels = pixel_settings(cfg.id, kwargs.pop("pixels", None))
    require_dm_control(cfg.id, pixels=pixels is not None)
    if pixels is not None:
        camera = {k: pixels[k] for k in ("width", "height", "camera_id")}
        kwargs.update(render_mode="rgb_array", render_kwargs=camera)
    try:
        env = gym.make(cfg.id, **kwargs)
    except AttributeError as exc:
        from importlib.metadata import version

        raise EnvError(
            f"{cfg.id!r}: dm-control {version('dm-control')} cannot load its physics with "
            f"mujoco {version('mujoco')} ({exc}); install the mujoco release that dm-control "
            "was built for"
        ) from None
    if pixels is None:
        return FlatState(env)
    try:
        env.reset(seed=0)
        env.render()
    except Exception as exc:  # noqa: BLE001 - mujoco.FatalError and the GL backends' errors
        env.close()
        raise EnvError(
            f"{cfg.id!r} with env.kwargs.pixels: MuJoCo cannot render here "
            f"(MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {exc}); it needs EGL (libEGL and a "
            "GPU or Mesa's EGL) or OSMesa (MUJOCO_GL=osmesa), set before dm_control is imported"
        ) from None
    return PixelFrames(env, pixels["frames"], pixels["height"], pixels["width"])


def make_dm_control_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``make_dm_control_env`` (NEXT_STEP autoreset): ``sync`` for
    ``auto``/``native`` (the suite has no vectorized form)."""
    mode = cfg.vectorization
    if mode == "envpool":
        raise EnvError(f"vectorization envpool is for Atari ids only, not {cfg.id!r}")
    require_dm_control(cfg.id, pixels=bool(cfg.kwargs.get("pixels")))
    make_dm_control_env(cfg).close()  # fail here, in this process, with the versions
    env_fn: Callable[[], gym.Env[Any, Any]] = lambda: make_dm_control_env(cfg)  # noqa: E731
    return copies_of(env_fn, num_envs, mode, f"dm_control environment {cfg.id!r}")
