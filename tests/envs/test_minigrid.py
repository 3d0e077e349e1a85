"""MiniGrid (``zrl.envs.minigrid``): the shipped config's vector env, made through the config
as the actors make it, steps with flat float32 observations of the agent's view; a missing
minigrid fails the preflight with the install line."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

from zrl.algos.models import experiment_model
from zrl.codecs.frames import is_frame_stack
from zrl.config.experiment import ConfigError, load_config
from zrl.envs.base import EnvError
from zrl.envs.minigrid import MINIGRID_INSTALL, is_minigrid, make_minigrid_env
from zrl.envs.vector import make_vector_env
from zrl.run.preflight import check_env_id, preflight
from zrl.testing.processes import REPO

CONFIG = REPO / "configs" / "minigrid_empty_ppo.yaml"


def test_minigrid_ids_are_recognised() -> None:
    assert is_minigrid("MiniGrid-Empty-5x5-v0") and is_minigrid("MiniGrid-DoorKey-5x5-v0")
    assert is_minigrid("BabyAI-GoToRedBall-v0")
    assert not is_minigrid("CartPole-v1") and not is_minigrid("ALE/Pong-v5")


def test_the_config_makes_a_vector_env_that_steps() -> None:
    pytest.importorskip("minigrid", reason=f"MiniGrid needs its extra: {MINIGRID_INSTALL}")
    cfg = load_config(CONFIG, ["env.num_envs=3"])
    env = make_vector_env(cfg.env)
    try:
        space = env.single_observation_space
        assert isinstance(space, gym.spaces.Box)
        assert space.shape == (7 * 7 * 3,) and space.dtype == np.float32
        assert not is_frame_stack(space)  # cell indices go to the MLP, not the /255 uint8 path
        assert isinstance(env.single_action_space, gym.spaces.Discrete)
        model = experiment_model(cfg, space, env.single_action_space)
        assert model is not None
        obs, _ = env.reset(seed=0)
        assert obs.shape == (3, 147) and obs.dtype == np.float32
        ends = 0
        for _ in range(120):  # an episode of Empty-5x5 ends after at most 100 steps
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            assert obs.shape == (3, 147) and reward.shape == (3,)
            ends += int(np.sum(terminated | truncated))
        assert ends >= 3
    finally:
        env.close()


def test_the_observation_is_the_flattened_image() -> None:
    minigrid = pytest.importorskip(
        "minigrid", reason=f"MiniGrid needs its extra: {MINIGRID_INSTALL}"
    )
    cfg = load_config(CONFIG).env
    env = make_minigrid_env(cfg)
    raw = minigrid.wrappers.ImgObsWrapper(gym.make(cfg.id))
    try:
        obs, _ = env.reset(seed=3)
        image, _ = raw.reset(seed=3)
        assert image.shape == (7, 7, 3) and image.dtype == np.uint8
        np.testing.assert_array_equal(obs, image.reshape(-1).astype(np.float32))
        for action in (2, 1, 2):  # forward, right, forward
            obs, *_ = env.step(action)
            image, *_ = raw.step(action)
            np.testing.assert_array_equal(obs, image.reshape(-1).astype(np.float32))
    finally:
        env.close()
        raw.close()


def test_a_missing_minigrid_fails_the_preflight_with_the_install_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "minigrid", None)  # import minigrid raises ImportError
    with pytest.raises(ConfigError, match=r"needs minigrid: pip install -e \"\.\[minigrid\]\""):
        check_env_id("MiniGrid-Empty-5x5-v0")
    with pytest.raises(ConfigError, match=r"\.\[minigrid\]"):
        preflight(load_config(CONFIG))
    with pytest.raises(EnvError, match=r"\.\[minigrid\]"):
        make_vector_env(load_config(CONFIG).env)
