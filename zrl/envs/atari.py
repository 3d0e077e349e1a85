"""Atari (ALE) environments with the standard DQN preprocessing, configured by ``env.atari``.

``make_vector_env`` sends ids in the ``ALE`` namespace (``ALE/Pong-v5``) and
``<Game>NoFrameskip-v4`` ids here. Every backend gives a NEXT_STEP vector env with discrete
actions and uint8 observations ``[N, stack, H, W]`` (``[N, stack, H, W, 3]`` in RGB): frames
stacked on a leading axis, newest last, zeros in place of the frames before a reset.

Backends (``env.vectorization``):

- ``auto`` / ``native``: ale-py's ``AtariVectorEnv`` (C++ threads, preprocessing in C++).
- ``sync`` / ``async``: the raw game (frameskip 1) in gymnasium's ``AtariPreprocessing``
  with ``FireResetEnv``, reward clipping and ``FrameStackObservation`` (zero padding), in
  a Sync/AsyncVectorEnv. With sticky actions off and ``noop_max: 0`` it gives the same
  observations, rewards and ends as ``native`` frame for frame (``tests/envs/test_atari.py``).
- ``envpool``: envpool's Atari, when it is installed (``pip install -e ".[envpool]"``).

A step is ``frameskip`` emulator frames. Episodic life and reward clipping are for training:
``evaluation=True`` turns both off so the evaluator plays whole games and reports true game
scores. Episodic life as ale-py's vector env does it: a lost life ends the episode, and the
next reset starts a new game (not the rest of the old one, as baselines' EpisodicLifeEnv did).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from zrl.config.sections import AtariConfig, EnvConfig
from zrl.envs.base import EnvError, register_env_namespace

_NO_FRAMESKIP = re.compile(r"^(?P<game>[A-Z][A-Za-z0-9]*)NoFrameskip-v\d+$")
_ALE = re.compile(r"^ALE/(?P<game>[A-Za-z0-9-]+?)(?:-v\d+)?$")
ENVPOOL_INSTALL = 'pip install -e ".[envpool]"'
ATARI_INSTALL = 'pip install -e ".[atari]"'
FIRE = 1
"""FIRE's index in ALE's action sets (the minimal and the full one) where a game has it."""


def _strip_module(env_id: str) -> str:
    return env_id.split(":")[-1]


def _register_ale() -> None:
    """ale-py registers its ids (``ALE/...`` and ``...NoFrameskip-v4``) when imported."""
    register_env_namespace("ALE/Pong-v5")


def _camel_game(env_id: str) -> str | None:
    """``Pong`` of ``ALE/Pong-v5`` or ``PongNoFrameskip-v4``, else None."""
    name = _strip_module(env_id)
    match = _ALE.match(name) or _NO_FRAMESKIP.match(name)
    return match["game"] if match else None


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an Atari game zrl preprocesses: ``ALE/<Game>-v5`` (any id in
    the ``ALE`` namespace) or ``<Game>NoFrameskip-v4``."""
    name = _strip_module(env_id)
    return name.startswith("ALE/") or _NO_FRAMESKIP.match(name) is not None


def game_name(env_id: str) -> str:
    """ale-py's ROM name of an Atari id (``ALE/SpaceInvaders-v5`` -> ``space_invaders``);
    an EnvError naming the id for an unknown game."""
    camel = _camel_game(env_id)
    if camel is None:
        raise EnvError(f"{env_id!r} is not an Atari id (ALE/<Game>-v5 or <Game>NoFrameskip-v4)")
    if camel.endswith("-ram"):
        raise EnvError(
            f"{env_id!r}: RAM observations are not supported by the Atari preprocessing; "
            f"use {env_id.replace('-ram', '')!r}"
        )
    try:
        from ale_py import roms
    except ImportError:
        raise EnvError(f"{env_id!r} needs ale-py: {ATARI_INSTALL}") from None
    _register_ale()
    spec = gym.registry.get(_strip_module(env_id))
    # The registry knows the irregular names (UpNDown -> up_n_down); the rule does the rest.
    game = str(spec.kwargs.get("game")) if spec is not None and "game" in spec.kwargs else None
    game = game or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()
    known = roms.get_all_rom_ids()
    if game not in known:
        import difflib

        close = difflib.get_close_matches(game, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise EnvError(f"{env_id!r}: ale-py has no Atari game {game!r}{hint}")
    return game


def settings(cfg: EnvConfig, evaluation: bool = False) -> AtariConfig:
    """``cfg.atari``, with episodic life and reward clipping off for evaluation."""
    if not evaluation:
        return cfg.atari
    return cfg.atari.model_copy(update={"episodic_life": False, "clip_rewards": False})


def native_kwargs(cfg: EnvConfig, evaluation: bool = False) -> dict[str, Any]:
    """The keyword arguments of ale-py's ``AtariVectorEnv`` for ``cfg`` (``cfg.kwargs`` last)."""
    a = settings(cfg, evaluation)
    return {
        "num_threads": a.num_threads,
        "max_num_frames_per_episode": a.max_episode_frames,
        "repeat_action_probability": a.repeat_action_probability,
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "img_height": a.screen_size,
        "img_width": a.screen_size,
        "grayscale": a.grayscale,
        "stack_num": a.stack,
        "frameskip": a.frameskip,
        "maxpool": True,
        "noop_max": a.noop_max,
        "episodic_life": a.episodic_life,
        "reward_clipping": a.clip_rewards,
        "use_fire_reset": a.fire_reset,
        **cfg.kwargs,
    }


class FireResetEnv(gym.Wrapper[Any, Any, Any, Any]):
    """Press FIRE once after each reset, for games that wait for it (Breakout, ...).

    Goes under ``AtariPreprocessing`` on the raw game (frameskip 1): one FIRE frame before
    the no-ops, which is what ale-py's AtariVectorEnv does (baselines' FireResetEnv pressed
    FIRE then UP for a 4-frame step each, after the no-ops). Games without FIRE are left as
    they are."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        self.has_fire = len(meanings) > FIRE and meanings[FIRE] == "FIRE"

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.has_fire:
            obs, _, terminated, truncated, info = self.env.step(FIRE)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        return obs, info


def make_atari_env(cfg: EnvConfig, evaluation: bool = False) -> gym.Env[Any, Any]:
    """One preprocessed Atari env (the ``sync``/``async`` backend): the raw game at
    frameskip 1, FireResetEnv, AtariPreprocessing, reward sign, zero-padded frame stack."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TransformReward

    a = settings(cfg, evaluation)
    _register_ale()
    env: gym.Env[Any, Any] = gym.make(
        _strip_module(cfg.id),
        frameskip=1,
        repeat_action_probability=a.repeat_action_probability,
        max_num_frames_per_episode=a.max_episode_frames,
        **cfg.kwargs,
    )
    if a.fire_reset:
        env = FireResetEnv(env)
    try:
        env = AtariPreprocessing(
            env,
            noop_max=a.noop_max,
            frame_skip=a.frameskip,
            screen_size=a.screen_size,
            terminal_on_life_loss=a.episodic_life,
            grayscale_obs=a.grayscale,
            scale_obs=False,
        )
    except gym.error.DependencyNotInstalled:
        env.close()
        raise EnvError(
            f"{cfg.id}: vectorization {cfg.vectorization} needs OpenCV: {ATARI_INSTALL}"
        ) from None
    if a.clip_rewards:  # the sign: Atari rewards are integers, so the same as clipping to ±1
        env = TransformReward(env, lambda r: float(np.sign(float(r))))
    return FrameStackObservation(env, a.stack, padding_type="zero")


def make_atari_vector_env(
    cfg: EnvConfig, num_envs: int, evaluation: bool = False
) -> gym.vector.VectorEnv:
    """``num_envs`` preprocessed copies of the Atari game ``cfg.id`` (NEXT_STEP autoreset)."""
    game = game_name(cfg.id)
    mode = cfg.vectorization
    try:
        if mode in ("auto", "native"):
            from ale_py.vector_env import AtariVectorEnv

            return AtariVectorEnv(game, num_envs, **native_kwargs(cfg, evaluation))
        if mode == "envpool":
            return _make_envpool(cfg, num_envs, evaluation)
        env_fn: Callable[[], gym.Env[Any, Any]] = lambda: make_atari_env(cfg, evaluation)  # noqa: E731
        vec_cls = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
        return vec_cls([env_fn] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    except EnvError:
        raise
    except (gym.error.Error, TypeError, ValueError, RuntimeError) as exc:
        raise EnvError(f"cannot make Atari environment {cfg.id!r}: {exc}") from None


def envpool_installed() -> bool:
    return importlib.util.find_spec("envpool") is not None


def _make_envpool(cfg: EnvConfig, num_envs: int, evaluation: bool) -> gym.vector.VectorEnv:
    if not envpool_installed():
        raise EnvError(f"{cfg.id}: vectorization envpool needs envpool: {ENVPOOL_INSTALL}")
    import envpool

    a = settings(cfg, evaluation)
    camel = _camel_game(cfg.id)
    pool = envpool.make_gymnasium(  # seeds: envpool takes one at creation (env.kwargs.seed)
        f"{camel}-v5",
        num_envs=num_envs,
        num_threads=a.num_threads,
        max_episode_steps=max(1, a.max_episode_frames // a.frameskip),  # envpool counts steps
        repeat_action_probability=a.repeat_action_probability,
        img_height=a.screen_size,
        img_width=a.screen_size,
        gray_scale=a.grayscale,
        stack_num=a.stack,
        frame_skip=a.frameskip,
        noop_max=a.noop_max,
        episodic_life=a.episodic_life,
        reward_clip=a.clip_rewards,
        use_fire_reset=a.fire_reset,
        **cfg.kwargs,
    )
    return _EnvpoolVectorEnv(pool, num_envs)


class _EnvpoolVectorEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """envpool's gymnasium-style pool as a gymnasium VectorEnv (it autoresets on the step
    after an episode ends: NEXT_STEP)."""

    def __init__(self, pool: Any, num_envs: int) -> None:
        self.pool = pool
        self.num_envs = num_envs
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        self.observation_space = gym.vector.utils.batch_space(pool.observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(pool.action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.pool.reset()
        return obs, dict(info)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(actions))
        return obs, reward, terminated, truncated, dict(info)

    def close(self, **kwargs: Any) -> None:
        close = getattr(self.pool, "close", None)
        if close is not None:
            close()


def backend_name(cfg: EnvConfig) -> str:
    return {
        "auto": "AtariVectorEnv",
        "native": "AtariVectorEnv",
        "sync": "gymnasium AtariPreprocessing (sync)",
        "async": "gymnasium AtariPreprocessing (async)",
        "envpool": "envpool",
    }[cfg.vectorization]


def describe(cfg: EnvConfig) -> str:
    """One line for the log, e.g. "Pong via AtariVectorEnv, frameskip 4: 1 env step = 4
    frames, 84x84x4 uint8, rewards clipped for training, episodic life for training"."""
    a = cfg.atari
    size = f"{a.screen_size}x{a.screen_size}x{a.stack}" + ("" if a.grayscale else "x3 RGB")
    parts = [
        f"{_camel_game(cfg.id) or cfg.id} via {backend_name(cfg)}, frameskip {a.frameskip}: "
        f"1 env step = {a.frameskip} frame{'s' if a.frameskip != 1 else ''}",
        f"{size} uint8",
        "rewards clipped for training" if a.clip_rewards else "rewards unclipped",
    ]
    if a.episodic_life:
        parts.append("episodic life for training")
    if a.repeat_action_probability:
        parts.append(f"sticky actions {a.repeat_action_probability:g}")
    return ", ".join(parts)
