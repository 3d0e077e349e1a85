"""MuJoCo (``gymnasium[mujoco]``, the v5 envs): each shipped config's vector env, made through
the config as the actors make it, steps with Box actions, and its model is the Gaussian
actor-critic (PPO, APPO) or SAC's policy and twin critics. Skipped, with the install line, where the
extra is missing."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.models import experiment_model
from zrl.config.experiment import load_config
from zrl.envs.vector import make_vector_env
from zrl.nets.continuous import SACModel
from zrl.nets.gaussian import GaussianActorCritic
from zrl.testing.processes import REPO

pytest.importorskip("mujoco", reason='MuJoCo needs its extra: pip install -e ".[mujoco]"')
torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("config", "obs_dim", "act_dim"),
    [
        ("halfcheetah_ppo.yaml", 17, 6),
        ("hopper_ppo.yaml", 11, 3),
        ("walker2d_ppo.yaml", 17, 6),
        ("humanoid_ppo.yaml", 348, 17),
        ("halfcheetah_appo.yaml", 17, 6),
        ("hopper_appo.yaml", 11, 3),
        ("walker2d_appo.yaml", 17, 6),
        ("humanoid_appo.yaml", 348, 17),
        ("ant_appo.yaml", 105, 8),
        ("ant_ppo.yaml", 105, 8),
    ],
)
def test_a_mujoco_config_makes_a_vector_env_that_steps(
    config, obs_dim, act_dim, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo logs its warnings to ./MUJOCO_LOG.TXT
    cfg = load_config(REPO / "configs" / config, ["env.num_envs=2"])
    env = make_vector_env(cfg.env)
    try:
        obs_space, act_space = env.single_observation_space, env.single_action_space
        assert obs_space.shape == (obs_dim,)
        assert isinstance(act_space, gym.spaces.Box) and act_space.shape == (act_dim,)
        model = experiment_model(cfg, obs_space, act_space)
        assert isinstance(model, GaussianActorCritic) and model.normalizer is not None
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, obs_dim)
        for _ in range(5):
            with torch.no_grad():
                actions = model.act(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            assert np.all(actions >= act_space.low) and np.all(actions <= act_space.high)
            obs, reward, terminated, truncated, _ = env.step(actions)
            assert obs.shape == (2, obs_dim) and reward.shape == (2,)
            assert np.all(np.isfinite(obs)) and np.all(np.isfinite(reward))
    finally:
        env.close()


@pytest.mark.parametrize(
    ("config", "obs_dim", "act_dim"),
    [
        ("halfcheetah_sac.yaml", 17, 6),
        ("hopper_sac.yaml", 11, 3),
        ("walker2d_sac.yaml", 17, 6),
        ("humanoid_sac.yaml", 348, 17),
        ("ant_sac.yaml", 105, 8),
    ],
)
def test_a_mujoco_sac_config_makes_a_vector_env_and_a_sac_model_that_acts(
    config, obs_dim, act_dim, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo logs its warnings to ./MUJOCO_LOG.TXT
    cfg = load_config(REPO / "configs" / config, ["env.num_envs=2"])
    assert cfg.algo == "sac"
    env = make_vector_env(cfg.env)
    try:
        obs_space, act_space = env.single_observation_space, env.single_action_space
        assert obs_space.shape == (obs_dim,)
        assert isinstance(act_space, gym.spaces.Box) and act_space.shape == (act_dim,)
        model = experiment_model(cfg, obs_space, act_space)
        # The zoo's 256x256 nets; SAC's twin critics.
        assert isinstance(model, SACModel) and model.q2 is not None
        widths = [m.out_features for m in model.policy.torso if isinstance(m, torch.nn.Linear)]
        assert widths == [256, 256]
        obs, _ = env.reset(seed=0)
        for _ in range(5):
            with torch.no_grad():
                actions = model.act(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            assert actions.shape == (2, act_dim)
            assert np.all(actions >= act_space.low) and np.all(actions <= act_space.high)
            obs, reward, terminated, truncated, _ = env.step(actions)
            assert obs.shape == (2, obs_dim) and np.all(np.isfinite(reward))
    finally:
        env.close()
