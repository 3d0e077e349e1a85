"""``make_vector_env`` (NEXT_STEP autoreset, vectorization modes, errors) and
``EpisodeTracker`` (returns and lengths, skipping the invalid autoreset steps)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError
from zrl.envs.vector import EpisodeTracker, make_vector_env

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


@pytest.mark.parametrize(
    ("env_id", "package", "extra"),
    [("HalfCheetah-v5", "mujoco", "mujoco"), ("LunarLander-v3", "Box2D", "box2d")],
)
def test_a_missing_gymnasium_extra_names_zrls_extra(monkeypatch, env_id, package, extra):
    # gymnasium's own message says pip install "gymnasium[mujoco]"; zrl installs its extra.
    family = f"gymnasium.envs.{extra}"
    for name in [m for m in sys.modules if m == family or m.startswith(f"{family}.")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, without the package
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(EnvError) as info:
        make_vector_env(EnvConfig(id=env_id, num_envs=1))
    assert str(info.value) == f'{env_id!r} needs {extra}: pip install -e ".[{extra}]"'


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


# --- env ids that import a module (issue 27, observation 9) ------------------------------------

PROBE = "zrl_env_id_probe"
PROBE_ID = f"{PROBE}:ProbeCartPole-v0"


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """A module on sys.path that, once imported, writes the file it yields and registers
    ProbeCartPole-v0 (gymnasium imports the module of an id ``module:Env-v0``)."""
    marker = tmp_path / "imported"
    (tmp_path / f"{PROBE}.py").write_text(
        "import pathlib\nimport gymnasium\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "gymnasium.register('ProbeCartPole-v0', "
        "entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop(PROBE, None)
    gym.registry.pop("ProbeCartPole-v0", None)


@contextlib.contextmanager
def broker_naming(addr, env_id, ctx):
    """A broker (unkeyed unless ``addr`` is inproc) whose config names ``env_id``, as a rogue
    broker's would, in a thread stopped on exit."""
    from zrl.broker.broker import Broker
    from zrl.config.experiment import ExperimentConfig

    cfg = ExperimentConfig.model_validate({"name": "env-id-test", "env": {"id": env_id}})
    broker = Broker(addr, cfg, ctx=ctx)
    thread = threading.Thread(target=broker.run, name="test-broker", daemon=True)
    thread.start()
    try:
        yield broker
    finally:
        broker.stop()
        thread.join(5)


def test_unkeyed_broker_naming_a_module_env_id_is_refused_unimported(
    probe_module, zmq_ctx, broker_addr
):
    from zrl.roles.actor import Actor
    from zrl.roles.errors import RoleError
    from zrl.testing.probes import wait_for

    errors: list[BaseException] = []

    def run() -> None:
        try:
            actor.run()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    with broker_naming(broker_addr, PROBE_ID, zmq_ctx):
        actor = Actor(broker_addr, index=0, ctx=zmq_ctx, connect_timeout=10)
        thread = threading.Thread(target=run, name="test-actor", daemon=True)
        thread.start()
        try:
            # Refused at WELCOME; without the rule the actor's setup imports the probe.
            wait_for(lambda: errors or probe_module.exists(), timeout=60)
        finally:
            actor.request_stop()
            thread.join(10)
            actor.close()
    assert not probe_module.exists() and PROBE not in sys.modules  # never imported
    assert len(errors) == 1 and isinstance(errors[0], RoleError)
    message = str(errors[0])
    assert "unauthenticated" in message and repr(PROBE_ID) in message and "--env-id" in message
    assert actor.config.env.id == "CartPole-v1"  # the refused config was not taken


def test_module_env_id_given_locally_or_by_an_authenticated_broker_is_made(
    probe_module, zmq_ctx, broker_addr
):
    from zrl.roles.actor import Actor

    # Given the same id on its command line (`zrl start actor --env-id`; zrl run passes it).
    with broker_naming(broker_addr, PROBE_ID, zmq_ctx):
        actor = Actor(broker_addr, index=0, ctx=zmq_ctx, connect_timeout=10, local_env_id=PROBE_ID)
        try:
            actor.connect()
            assert not probe_module.exists()  # taken, not yet imported
            envs = actor.make_envs(num_envs=1)
            envs.close()
        finally:
            actor.close()
    assert actor.config.env.id == PROBE_ID and probe_module.exists()
    # An id without a module never needed one; an inproc broker is this process's own.
    inproc = f"inproc://zrl-env-id-{os.getpid()}"
    with broker_naming(inproc, PROBE_ID, zmq_ctx):
        actor = Actor(inproc, index=0, ctx=zmq_ctx, connect_timeout=10)
        try:
            actor.connect()
        finally:
            actor.close()
    assert actor.config.env.id == PROBE_ID


def test_zrl_run_passes_a_module_env_id_to_its_roles():
    from zrl.cli.start import role_options
    from zrl.config.experiment import ExperimentConfig
    from zrl.config.factories import Factories, env_id_module
    from zrl.run.placement import role_trust_args

    assert env_id_module(PROBE_ID) == PROBE and env_id_module("ALE/Pong-v5") is None
    module_cfg = ExperimentConfig.model_validate({"env": {"id": PROBE_ID}})
    assert f"--env-id={PROBE_ID}" in role_trust_args(module_cfg, Factories())
    assert not any(
        a.startswith("--env-id") for a in role_trust_args(ExperimentConfig(), Factories())
    )
    options = role_options(30.0, None, "client", None, None, None, PROBE_ID)
    assert options["local_env_id"] == PROBE_ID
