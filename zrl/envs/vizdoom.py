"""VizDoom scenarios as zrl envs: ``env.id: vizdoom/<scenario>`` (``pip install -e ".[vizdoom]"``).

``<scenario>`` is a ``.cfg`` file the vizdoom wheel ships in ``vizdoom.scenarios_path``
(``basic``, ``defend_the_center``, ``health_gathering``, ``deathmatch``, ``my_way_home``, ...;
:func:`scenarios` lists them). Settings are Sample Factory's (``sf_examples/vizdoom``): the
engine renders 160x120 RGB, each frame is resized to 128x72 (nearest pixel, as its
``ResizeWrapper``), and one env step repeats the action for ``frameskip: 4`` tics (rewards
summed). Observations are uint8 ``[3, 72, 128]``, channels first: one RGB frame, not a stack
of 3 grey frames, so its observation space is marked with
:func:`zrl.envs.base.mark_single_image` and unrolls send whole observations (no
``frame_unroll``). Actions are ``Discrete(1 + B)``: 0 does nothing, ``1 + i`` presses the
scenario's i-th binary button alone; its delta buttons (mouse-like turning in ``deathmatch``)
stay at 0. An episode ends terminated when the player dies or the scenario's goal ends it,
truncated at the scenario's ``episode_timeout``.

``env.kwargs`` (all optional): ``frameskip`` (4), ``width`` (128), ``height`` (72),
``render_resolution`` (``"160x120"``, a ``vizdoom.ScreenResolution`` name without ``RES_``),
``health_reward`` (0.0): added to a step's reward when the player's health rose during it (a
medkit picked up): Sample Factory's ``DoomGatheringRewardShaping`` (+1) for the gathering
scenarios, where the scenario's own reward (+1 a tic alive) shows a medkit only as a later
death. The engine runs headless (no window). ``env.vectorization`` sync (``auto`` means sync) or
async (one process per env).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np

from zrl.config.sections import EnvConfig
from zrl.envs.base import MAKE_ERRORS, EnvError, copies_of, mark_single_image

PREFIX = "vizdoom/"
VIZDOOM_INSTALL = 'pip install -e ".[vizdoom]"'
DEFAULTS: dict[str, Any] = {
    "frameskip": 4,
    "width": 128,
    "height": 72,
    "render_resolution": "160x120",
    "health_reward": 0.0,
}
"""Sample Factory's VizDoom settings (``sf_examples/vizdoom/doom/doom_params.py``)."""


def is_vizdoom(env_id: str) -> bool:
    """Whether ``env_id`` names a VizDoom scenario: ``vizdoom/<scenario>``."""
    return env_id.startswith(PREFIX)


def _import_vizdoom(env_id: str) -> Any:
    try:
        import vizdoom
    except ImportError:
        raise EnvError(f"{env_id!r} needs vizdoom: {VIZDOOM_INSTALL}") from None
    return vizdoom


def scenarios() -> list[str]:
    """The scenario names the installed vizdoom wheel ships (its ``.cfg`` files)."""
    vzd = _import_vizdoom(PREFIX + "*")
    return sorted(
        name.removesuffix(".cfg")
        for name in os.listdir(vzd.scenarios_path)
        if name.endswith(".cfg")
    )


def scenario_config(env_id: str) -> str:
    """The path of the ``.cfg`` file of ``vizdoom/<scenario>``; an EnvError naming the id and
    the shipped scenarios when there is none."""
    vzd = _import_vizdoom(env_id)
    name = env_id.removeprefix(PREFIX)
    path = os.path.join(vzd.scenarios_path, f"{name}.cfg")
    if not name or "/" in name or not os.path.isfile(path):
        raise EnvError(f"{env_id!r}: vizdoom has no scenario {name!r}; it ships {scenarios()}")
    return path


def env_settings(cfg: EnvConfig) -> dict[str, Any]:
    """:data:`DEFAULTS` updated by ``cfg.kwargs``; an EnvError names an unknown key."""
    unknown = sorted(set(cfg.kwargs) - set(DEFAULTS))
    if unknown:
        raise EnvError(f"{cfg.id}: unknown env.kwargs {unknown}; VizDoom takes {sorted(DEFAULTS)}")
    return {**DEFAULTS, **cfg.kwargs}


class VizdoomEnv(gym.Env[np.ndarray, np.int64]):
    """One headless VizDoom game of a scenario, as a gymnasium env of uint8 ``[3, H, W]``
    RGB frames and ``Discrete(1 + buttons)`` actions (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        env_id: str,
        frameskip: int = 4,
        width: int = 128,
        height: int = 72,
        render_resolution: str = "160x120",
        health_reward: float = 0.0,
    ) -> None:
        vzd = _import_vizdoom(env_id)
        try:
            import cv2
        except ImportError:
            raise EnvError(f"{env_id!r} needs OpenCV to resize frames: {VIZDOOM_INSTALL}") from None
        self._cv2 = cv2
        if frameskip < 1 or width < 1 or height < 1:
            raise EnvError(f"{env_id}: frameskip {frameskip}, width {width}, height {height}")
        resolution = getattr(vzd.ScreenResolution, f"RES_{render_resolution.upper()}", None)
        if resolution is None:
            raise EnvError(f"{env_id}: vizdoom has no screen resolution {render_resolution!r}")
        self.frameskip = int(frameskip)
        self._health_variable = vzd.GameVariable.HEALTH
        self.health_reward = float(health_reward)
        if not np.isfinite(self.health_reward):
            raise EnvError(f"{env_id}: health_reward {health_reward!r} is not a finite number")
        self.size = (int(width), int(height))
        game = vzd.DoomGame()
        game.load_config(scenario_config(env_id))
        game.set_window_visible(False)
        # The engine writes its settings file to the working directory unless told elsewhere.
        game.set_doom_config_path(os.path.join(tempfile.gettempdir(), "zrl_vizdoom.ini"))
        game.set_sound_enabled(False)
        game.set_screen_format(vzd.ScreenFormat.RGB24)
        game.set_screen_resolution(resolution)
        game.set_mode(vzd.Mode.PLAYER)
        self.buttons = [
            i for i, b in enumerate(game.get_available_buttons()) if not vzd.is_delta_button(b)
        ]
        self.num_buttons = len(game.get_available_buttons())
        game.init()
        self.game = game
        self.observation_space = mark_single_image(
            gym.spaces.Box(0, 255, (3, int(height), int(width)), np.uint8)
        )
        self.num_actions = 1 + len(self.buttons)
        self.action_space = gym.spaces.Discrete(self.num_actions)
        self._last: np.ndarray = np.zeros((3, int(height), int(width)), np.uint8)
        self._health = 0.0

    def _observe(self) -> np.ndarray:
        state = self.game.get_state()
        if state is None:  # the episode has ended: its last frame again
            return self._last.copy()
        cv2 = self._cv2
        frame = cv2.resize(state.screen_buffer, self.size, interpolation=cv2.INTER_NEAREST)
        self._last = np.ascontiguousarray(frame.transpose(2, 0, 1))
        return self._last.copy()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.game.set_seed(int(seed) % 2**31)
        self.game.new_episode()
        self._health = self.health()
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        if not 0 <= a < self.num_actions:
            raise ValueError(f"action {a} is outside Discrete({self.num_actions})")
        pressed = [0.0] * self.num_buttons
        if a > 0:
            pressed[self.buttons[a - 1]] = 1.0
        reward = float(self.game.make_action(pressed, self.frameskip))
        done = bool(self.game.is_episode_finished())
        if self.health_reward and not done:
            health = self.health()
            if health > self._health:
                reward += self.health_reward
            self._health = health
        truncated = done and bool(self.game.is_episode_timeout_reached())
        return self._observe(), reward, done and not truncated, truncated, {}

    def health(self) -> float:
        """The player's health now (the engine's ``HEALTH`` game variable)."""
        return float(self.game.get_game_variable(self._health_variable))

    def close(self) -> None:
        self.game.close()


def make_vizdoom_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the scenario ``cfg.id`` (NEXT_STEP autoreset): sync (``auto``,
    ``sync``) or async vector env. Fails before any game starts, with the install line, when
    vizdoom is missing."""
    scenario_config(cfg.id)  # imports vizdoom: its install line if it is missing
    kwargs = env_settings(cfg)
    mode = cfg.vectorization
    if mode not in ("auto", "sync", "async"):
        raise EnvError(f"{cfg.id}: VizDoom runs with vectorization auto, sync or async, not {mode}")
    env_id = cfg.id
    return copies_of(
        lambda: VizdoomEnv(env_id, **kwargs),
        num_envs,
        mode,
        f"VizDoom environment {cfg.id!r}",
        errors=(*MAKE_ERRORS, RuntimeError),
    )
