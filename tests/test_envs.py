"""``make_vector_env`` (NEXT_STEP autoreset, vectorization modes, errors) and
``EpisodeTracker`` (returns and lengths, skipping the invalid autoreset steps)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from zrl.config_sections import EnvConfig
from zrl.envs import EnvError, EpisodeTracker, flat_obs_dim, make_vector_env

torch.set_num_threads(1)


@pytest.mark.parametrize(("mode", "native"), [("auto", True), ("native", True), ("sync", False)])
def test_make_vector_env_cartpole(mode, native):
    env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=3, vectorization=mode))
    try:
        assert env.num_envs == 3
        assert env.metadata.get("autoreset_mode") == AutoresetMode.NEXT_STEP
        assert isinstance(env, gym.vector.SyncVectorEnv) != native
        assert env.single_observation_space.shape == (4,)
        assert int(env.single_action_space.n) == 2
        obs, _ = env.reset(seed=0)
        assert np.asarray(obs).shape == (3, 4)
        # NEXT_STEP: the step after an episode end only resets that env (reward 0, not done).
        ended = np.zeros(3, bool)
        for _ in range(300):
            _, r, term, trunc, _ = env.step(np.ones(3, np.int64))  # always push right: falls
            r = np.asarray(r)
            if ended.any():
                assert np.all(r[ended] == 0.0)
                assert not np.any((np.asarray(term) | np.asarray(trunc))[ended])
                break
            ended = np.asarray(term) | np.asarray(trunc)
        else:
            pytest.fail("no CartPole episode ended in 300 steps of constant actions")
    finally:
        env.close()


def test_num_envs_argument_overrides_config():
    env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=8), num_envs=1)
    try:
        assert env.num_envs == 1
    finally:
        env.close()


def test_auto_falls_back_to_sync_without_native_form():
    env = make_vector_env(EnvConfig(id="Pendulum-v1", num_envs=2, vectorization="auto"))
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv)
        assert env.num_envs == 2
        assert env.metadata.get("autoreset_mode") == AutoresetMode.NEXT_STEP
    finally:
        env.close()


def test_native_without_native_form_is_an_env_error():
    with pytest.raises(EnvError, match="Pendulum-v1 has no native vectorized form"):
        make_vector_env(EnvConfig(id="Pendulum-v1", num_envs=2, vectorization="native"))


@pytest.mark.parametrize("mode", ["auto", "native", "sync", "async"])
def test_bad_env_id_is_an_env_error_naming_it(mode):
    with pytest.raises(EnvError, match="NoSuchEnv-v0"):
        make_vector_env(EnvConfig(id="NoSuchEnv-v0", num_envs=2, vectorization=mode))


def test_bad_env_kwargs_are_an_env_error():
    with pytest.raises(EnvError, match="CartPole-v1"):
        make_vector_env(EnvConfig(id="CartPole-v1", num_envs=2, kwargs={"bogus": 1}))


def test_flat_obs_dim():
    assert flat_obs_dim(gym.spaces.Box(0, 1, (3, 4))) == 12
    with pytest.raises(EnvError, match="not a Box"):
        flat_obs_dim(gym.spaces.Discrete(3))


# --- EpisodeTracker -----------------------------------------------------------------------


def test_episode_tracker_by_hand():
    """Two envs. Env 0: rewards 1, 2, 3 then terminated; the next step is the invalid
    autoreset step (reward 5 must not count); then 4, 4 and truncated. Env 1: 10 every step,
    never done."""
    tr = EpisodeTracker(2)
    steps = [
        # rewards, done, valid
        ([1.0, 10.0], [False, False], [True, True]),
        ([2.0, 10.0], [False, False], [True, True]),
        ([3.0, 10.0], [True, False], [True, True]),
        ([5.0, 10.0], [False, False], [False, True]),  # env 0 resets
        ([4.0, 10.0], [False, False], [True, True]),
        ([4.0, 10.0], [True, False], [True, True]),
    ]
    for r, d, v in steps:
        tr.update(np.array(r), np.array(d), np.array(v))
    assert tr.finished_returns == [6.0, 8.0]
    assert tr.finished_lengths == [3, 2]
    assert tr.episodes == 2
    assert tr.recent_mean() == 7.0
    # Env 1 is still running with 6 steps; env 0 starts afresh.
    assert tr.running_return.tolist() == [0.0, 60.0]
    assert tr.running_length.tolist() == [0, 6]


def test_episode_tracker_empty_and_window():
    tr = EpisodeTracker(1)
    assert tr.recent_mean() is None and tr.episodes == 0
    for i in range(150):  # 150 one-step episodes, each followed by its reset step
        tr.update(np.array([float(i)]), np.array([True]), np.array([True]))
        tr.update(np.array([0.0]), np.array([False]), np.array([False]))
    assert tr.episodes == 150
    assert len(tr.finished_returns) == len(tr.finished_lengths) == 100
    assert tr.finished_returns == [float(i) for i in range(50, 150)]
    assert tr.finished_lengths == [1] * 100


def test_episode_tracker_on_a_real_rollout():
    """Against a reference count on CartPole (reward 1 per valid step): every finished
    episode's return equals its length, and lengths add up to the valid steps."""
    n = 4
    env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=n))
    rng = np.random.default_rng(0)
    tr = EpisodeTracker(n)
    needs_reset = np.zeros(n, bool)
    ref_lengths: list[int] = []  # in the order episodes end (step, then env)
    running = np.zeros(n, int)
    valid_steps = 0
    try:
        env.reset(seed=1)
        for _ in range(400):
            _, r, term, trunc, _ = env.step(rng.integers(0, 2, n))
            done = np.asarray(term) | np.asarray(trunc)
            valid = ~needs_reset
            tr.update(np.asarray(r, np.float64), done, valid)
            valid_steps += int(valid.sum())
            for e in range(n):
                if valid[e]:
                    running[e] += 1
                    if done[e]:
                        ref_lengths.append(int(running[e]))
                        running[e] = 0
            needs_reset = done
    finally:
        env.close()
    assert len(ref_lengths) >= 20  # random CartPole episodes are short
    assert tr.episodes == len(ref_lengths)
    assert tr.finished_lengths == ref_lengths[-100:]
    assert tr.finished_returns == [float(x) for x in tr.finished_lengths]
    assert sum(tr.finished_lengths) + int(tr.running_length.sum()) == valid_steps
    assert tr.running_length.tolist() == running.tolist()


def test_no_velocity_envs_hide_the_velocities():
    """zrl/CartPoleNoVel-v1 observes (x, theta) of CartPole-v1's (x, x_dot, theta, theta_dot);
    zrl/PendulumNoVel-v1 (cos, sin) of Pendulum's (cos, sin, theta_dot). Same dynamics."""
    for masked, full, keep in (
        ("zrl/CartPoleNoVel-v1", "CartPole-v1", [0, 2]),
        ("zrl/PendulumNoVel-v1", "Pendulum-v1", [0, 1]),
    ):
        a, b = gym.make(masked), gym.make(full)
        obs_a, _ = a.reset(seed=3)
        obs_b, _ = b.reset(seed=3)
        assert a.observation_space.shape == (2,)
        np.testing.assert_array_equal(obs_a, obs_b[keep])
        for _ in range(5):
            action = b.action_space.sample()
            step_a, step_b = a.step(action), b.step(action)
            np.testing.assert_array_equal(step_a[0], step_b[0][keep])
            assert step_a[1:4] == step_b[1:4]
    envs = make_vector_env(EnvConfig(id="zrl/CartPoleNoVel-v1", vectorization="sync"), 3)
    assert envs.single_observation_space.shape == (2,) and envs.num_envs == 3
    envs.close()
