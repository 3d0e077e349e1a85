"""dm_control through shimmy (``zrl.envs.dmcontrol``): a ``dm_control/...`` id makes a vector
env through the config, with the suite's Dict of state arrays as one float32 vector; a missing
dm-control or shimmy fails the preflight with the install line. The stepping tests skip, with
the reason, where the extra is missing or dm-control cannot load its physics with the
installed mujoco (dm-control 1.0.50 with mujoco 4.0)."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from zrl.config.experiment import ConfigError, load_config
from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError
from zrl.envs.dmcontrol import (
    DM_CONTROL_INSTALL,
    FlatState,
    is_dm_control,
    make_dm_control_env,
    pixel_settings,
)
from zrl.envs.vector import make_vector_env
from zrl.run.preflight import check_env_id, preflight
from zrl.testing.processes import REPO

ENV_ID = "dm_control/cartpole-balance-v0"


def _cartpole() -> EnvConfig:
    """The config's env section, or a skip saying why dm_control cannot make cartpole here."""
    pytest.importorskip("shimmy", reason=f"dm_control needs its extra: {DM_CONTROL_INSTALL}")
    pytest.importorskip("dm_control", reason=f"dm_control needs its extra: {DM_CONTROL_INSTALL}")
    cfg = EnvConfig(id=ENV_ID, num_envs=2)
    try:
        make_dm_control_env(cfg).close()
    except EnvError as exc:
        pytest.skip(str(exc))
    return cfg


def test_dm_control_ids_are_recognised() -> None:
    assert is_dm_control(ENV_ID) and is_dm_control("dm_control/walker-walk-v0")
    assert not is_dm_control("CartPole-v1") and not is_dm_control("MiniGrid-Empty-5x5-v0")


def test_flat_state_concatenates_the_dict_as_float32() -> None:
    space = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
            "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
        }
    )

    class DictEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
        observation_space = space
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            return {"position": np.array([1.0, 2.0, 3.0]), "velocity": np.array([4.0, 5.0])}, {}

    env = FlatState(DictEnv())
    assert env.observation_space.shape == (5,) and env.observation_space.dtype == np.float32
    obs, _ = env.reset()
    assert obs.dtype == np.float32
    np.testing.assert_array_equal(obs, [1.0, 2.0, 3.0, 4.0, 5.0])


def test_a_dm_control_env_made_through_the_config_steps(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo logs its warnings to ./MUJOCO_LOG.TXT
    cfg = _cartpole()
    env = make_vector_env(cfg)
    try:
        assert env.single_observation_space.shape == (5,)
        assert env.single_observation_space.dtype == np.float32
        assert isinstance(env.single_action_space, gym.spaces.Box)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 5) and obs.dtype == np.float32
        for _ in range(5):
            obs, reward, *_ = env.step(env.action_space.sample())
            assert obs.shape == (2, 5) and np.all(np.isfinite(obs))
            assert np.all((reward >= 0.0) & (reward <= 1.0))
    finally:
        env.close()


@pytest.mark.parametrize("missing", ["shimmy", "dm_control"])
def test_a_missing_package_fails_the_preflight_with_the_install_line(
    missing, monkeypatch, tmp_path
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # importing it raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e \"\.\[dm_control\]\""):
        check_env_id(ENV_ID)
    cfg = load_config(REPO / "configs" / "pendulum_ppo.yaml", [f"env.id={ENV_ID}"])
    with pytest.raises(ConfigError, match=r"\.\[dm_control\]"):
        preflight(cfg)
    with pytest.raises(EnvError, match=r"\.\[dm_control\]"):
        make_vector_env(cfg.env)


@pytest.mark.parametrize(
    ("pixels", "match"),
    [
        ("yes", "must be true, false or a map"),
        ({"size": 84}, r"unknown key\(s\) \['size'\]"),
        ({"frames": 0}, r"pixels.frames must be an integer in \[1, 16\]"),
        ({"width": 4096}, r"pixels.width must be an integer in \[1, 512\]"),
        ({"camera_id": True}, "pixels.camera_id"),
    ],
)
def test_pixel_settings_name_the_bad_key_or_value(pixels, match) -> None:
    with pytest.raises(EnvError, match=match):
        pixel_settings(ENV_ID, pixels)


def test_pixel_settings_default_to_84x84_and_3_frames() -> None:
    assert pixel_settings(ENV_ID, None) is None and pixel_settings(ENV_ID, False) is None
    assert pixel_settings(ENV_ID, True) == {"width": 84, "height": 84, "camera_id": 0, "frames": 3}
    assert pixel_settings(ENV_ID, {"width": 64, "frames": 2})["width"] == 64


PIXEL_RUN = """
import sys
import numpy as np, torch
from zrl.algos.models import experiment_model
from zrl.config.experiment import load_config
from zrl.envs.base import EnvError, is_single_image
from zrl.envs.vector import make_vector_env
from zrl.run.preflight import preflight
cfg = load_config(sys.argv[1], ["env.num_envs=2", "env.kwargs.pixels={width: 64, height: 48}"])
try:
    preflight(cfg)  # dm_control imported here first, as zrl run's head does
    env = make_vector_env(cfg.env)
except EnvError as exc:
    print("SKIP", exc)
    raise SystemExit(0)
space = env.single_observation_space
assert space.shape == (9, 48, 64) and space.dtype == np.uint8 and is_single_image(space)
model = experiment_model(cfg, space, env.single_action_space)
obs, _ = env.reset(seed=0)
first = obs.copy()
assert obs.shape == (2, 9, 48, 64) and (obs[:, :3] == obs[:, 6:]).all()  # reset: one frame x3
for _ in range(3):
    with torch.no_grad():
        actions = model.act(torch.as_tensor(obs)).numpy()
    obs, reward, *_ = env.step(actions)
assert (obs[:, 6:] != first[:, 6:]).any() and np.all((reward >= 0) & (reward <= 1))
env.close()
print("OK", type(model.encoder).__name__)
"""


def test_pixel_observations_are_stacked_rgb_frames_a_cnn_policy_acts_on(tmp_path) -> None:
    """``env.kwargs.pixels`` through the config, in a fresh process (MuJoCo's renderer is
    picked as dm_control is imported): uint8 ``[9, H, W]`` (3 RGB frames, one image), the
    Gaussian policy with a CNN acts on it. Skipped, with the reason, where MuJoCo cannot
    render headless (no EGL)."""
    _cartpole()
    config = REPO / "configs" / "dmc_cartpole_balance_ppo.yaml"
    run = subprocess.run(
        [sys.executable, "-c", PIXEL_RUN, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "MUJOCO_GL"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    if run.stdout.startswith("SKIP"):
        pytest.skip(run.stdout.strip())
    assert run.stdout.strip() == "OK NatureCNN", run.stdout
