"""VizDoom (``zrl.envs.vizdoom``): each shipped config's vector env, made through the config as
the actors make it, steps with uint8 RGB ``[3, 72, 128]`` observations that a Nature CNN takes
and the scenario's own rewards;
RGB frames are single images, so actors send whole observations, not frame unrolls; a missing
vizdoom fails the preflight with the install line."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.api.actor import Trajectory
from zrl.algos.models import experiment_model
from zrl.algos.registry import get_algorithm
from zrl.codecs.frames import is_frame_space
from zrl.config.experiment import ConfigError, load_config
from zrl.envs.base import EnvError, is_single_image, mark_single_image
from zrl.envs.vector import make_vector_env
from zrl.envs.vizdoom import VIZDOOM_INSTALL, VizdoomEnv, is_vizdoom, scenarios
from zrl.nets.discrete import policy_logits
from zrl.run.preflight import check_env_id, preflight
from zrl.testing.fakes import actor_setup
from zrl.testing.processes import REPO

CONFIG = REPO / "configs" / "vizdoom_basic_appo.yaml"
SKIP = f"VizDoom needs its extra: {VIZDOOM_INSTALL}"


def test_vizdoom_ids_are_recognised() -> None:
    assert is_vizdoom("vizdoom/basic") and is_vizdoom("vizdoom/deathmatch")
    assert not is_vizdoom("VizdoomBasic-v0") and not is_vizdoom("ALE/Pong-v5")


def test_the_wheel_ships_the_standard_scenarios() -> None:
    pytest.importorskip("vizdoom", reason=SKIP)
    shipped = scenarios()
    for name in ("basic", "defend_the_center", "health_gathering", "deathmatch"):
        assert name in shipped
    with pytest.raises(ConfigError, match=r"no scenario 'basik'.*'basic'"):
        check_env_id("vizdoom/basik")


@pytest.mark.parametrize(
    ("config", "scenario", "left_reward"),
    [
        # basic: -1 a tic, 4 tics a step (a shot that misses costs 5 more)
        ("vizdoom_basic_appo.yaml", "basic", -4.0),
        # defend_the_center: +1 a kill, nothing while turning
        ("vizdoom_defend_the_center_appo.yaml", "defend_the_center", 0.0),
    ],
)
def test_a_config_makes_a_vector_env_that_steps(
    config: str, scenario: str, left_reward: float
) -> None:
    pytest.importorskip("vizdoom", reason=SKIP)
    cfg = load_config(REPO / "configs" / config, ["env.num_envs=2"])
    assert cfg.env.id == f"vizdoom/{scenario}"
    kwargs = cfg.env.kwargs  # Sample Factory's 128x72 frames, 4 tics a step
    assert (kwargs["frameskip"], kwargs["width"], kwargs["height"]) == (4, 128, 72)
    env = make_vector_env(cfg.env)
    try:
        space = env.single_observation_space
        assert isinstance(space, gym.spaces.Box)
        assert space.shape == (3, 72, 128) and space.dtype == np.uint8
        assert is_single_image(space) and not is_frame_space(space)
        assert env.single_action_space == gym.spaces.Discrete(4)  # no-op, left, right, attack
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 3, 72, 128) and obs.dtype == np.uint8 and obs.max() > 0
        rewards = []
        for _ in range(5):
            obs, reward, terminated, truncated, _ = env.step(np.array([1, 3]))
            assert obs.shape == (2, 3, 72, 128) and obs.dtype == np.uint8
            rewards.append(reward)
        # the first env moves or turns left: the scenario's own reward, unscaled
        assert np.all(np.array(rewards)[:, 0] == left_reward)
        model = experiment_model(cfg, space, env.single_action_space)
        with torch.no_grad():  # zrl's Nature CNN takes a 3-channel 72x128 uint8 frame
            assert policy_logits(model, torch.from_numpy(obs)).shape == (2, 4)
    finally:
        env.close()


def test_health_reward_adds_its_bonus_on_each_step_whose_health_rose() -> None:
    """The same seed and actions with and without ``health_reward``: the returns differ by the
    bonus times the steps where the player's health rose (medkits), and nothing else."""
    pytest.importorskip("vizdoom", reason=SKIP)
    plain = VizdoomEnv("vizdoom/health_gathering")
    shaped = VizdoomEnv("vizdoom/health_gathering", health_reward=0.5)
    rng = np.random.default_rng(0)
    try:
        rises = 0
        for episode in range(3):
            plain.reset(seed=episode)
            shaped.reset(seed=episode)
            health = plain.health()
            done = False
            while not done:
                action = int(rng.integers(0, 4))
                _, reward, terminated, truncated, _ = plain.step(action)
                _, shaped_reward, *_ = shaped.step(action)
                done = terminated or truncated
                now = health if done else plain.health()
                rose = now > health
                assert shaped_reward == reward + (0.5 if rose else 0.0)
                rises += rose
                health = now
        assert rises > 0  # random actions pick up medkits
    finally:
        plain.close()
        shaped.close()
    with pytest.raises(EnvError, match="health_reward nan"):
        VizdoomEnv("vizdoom/health_gathering", health_reward=float("nan"))


def test_a_missing_vizdoom_fails_the_preflight_with_the_install_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vizdoom", None)  # import vizdoom raises ImportError
    with pytest.raises(ConfigError, match=r"needs vizdoom: pip install -e \"\.\[vizdoom\]\""):
        check_env_id("vizdoom/basic")
    with pytest.raises(ConfigError, match=r"\.\[vizdoom\]"):
        preflight(load_config(CONFIG))
    with pytest.raises(EnvError, match=r"\.\[vizdoom\]"):
        make_vector_env(load_config(CONFIG).env)


@pytest.mark.parametrize("rgb", [True, False])
def test_rgb_images_travel_whole_and_frame_stacks_as_single_frames(rgb: bool) -> None:
    """The env decides the layout: a space marked single-image (VizDoom's RGB) is not a stack
    of 3 frames, so the APPO actor sends the observations themselves; an unmarked uint8
    [k, H, W] space is a frame stack, sent as each frame once."""
    cfg = load_config(CONFIG)
    space = gym.spaces.Box(0, 255, (3, 72, 128), np.uint8)
    if rgb:
        space = mark_single_image(space)
    assert is_frame_space(space) is not rgb
    actions = gym.spaces.Discrete(4)
    E, T = 2, 4
    policy_cls = get_algorithm("appo").policy
    policy = policy_cls(actor_setup(cfg, experiment_model(cfg, space, actions), space, actions, E))
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (E, T, 3, 72, 128), dtype=np.uint8)
    trajectory = Trajectory(
        obs=obs,
        next_obs=None,
        action=np.zeros((E, T), np.int64),
        reward=np.zeros((E, T), np.float32),
        terminated=np.zeros((E, T), bool),
        truncated=np.zeros((E, T), bool),
        valid=np.ones((E, T), bool),
        final_obs=obs[:, -1],
        extras={"logp": np.zeros((E, T), np.float32)},
    )
    arrays = policy.finish(trajectory).arrays
    if rgb:
        assert "frames" not in arrays
        np.testing.assert_array_equal(arrays["obs"], obs)
    else:
        assert "obs" not in arrays and arrays["frames"].shape == (E, T + 3, 72, 128)
