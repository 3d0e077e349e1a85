"""The preflight checks: one env and the model, made before any role starts."""

from __future__ import annotations

import gymnasium as gym
import pytest
from torch import nn

from zrl.config.experiment import ConfigError, load_config
from zrl.config.factories import Factories
from zrl.run.preflight import check_env, check_model, preflight
from zrl.testing.processes import REPO

CARTPOLE = REPO / "configs" / "cartpole_apex_dqn.yaml"


def cartpole(*overrides: str):
    return load_config(CARTPOLE, list(overrides))


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_pass(config, tmp_path, monkeypatch):
    if "lunarlander" in config:
        pytest.importorskip("Box2D")
    if config.startswith(("halfcheetah", "hopper")):
        pytest.importorskip("mujoco", reason='MuJoCo configs need pip install -e ".[mujoco]"')
        monkeypatch.chdir(tmp_path)  # MuJoCo logs its warnings to ./MUJOCO_LOG.TXT
    if config.startswith("minigrid"):
        pytest.importorskip("minigrid", reason='MiniGrid configs need pip install -e ".[minigrid]"')
    preflight(load_config(REPO / "configs" / config))


def test_good_env_gives_its_spaces():
    obs, act = check_env(cartpole())
    assert obs.shape == (4,) and act == gym.spaces.Discrete(2)


@pytest.mark.parametrize(
    ("env_id", "expected"),
    [
        ("CartPol-v1", "Did you mean: `CartPole`?"),
        ("CartPole-v9", "It provides versioned environments"),
        ("Nope/CartPole-v1", "Namespace Nope not found"),
        ("no_such_module:CartPole-v1", "cannot import 'no_such_module'"),
    ],
)
def test_bad_env_id_is_named_with_gymnasiums_hint(env_id, expected):
    with pytest.raises(ConfigError) as info:
        preflight(cartpole(f"env.id={env_id}"))
    msg = str(info.value)
    assert msg.startswith(f"env.id {env_id!r}")
    assert expected in msg


@pytest.mark.filterwarnings("ignore:.*latest versioned environment")
def test_unversioned_env_id_passes_as_gym_make_takes_the_latest():
    check_env(cartpole("env.id=CartPole"))


def test_bad_env_kwargs_are_named():
    with pytest.raises(ConfigError) as info:
        check_env(cartpole("env.kwargs={max_speed: 3}"))
    msg = str(info.value)
    assert msg.startswith("env.kwargs {'max_speed': 3} do not apply to 'CartPole-v1'")
    assert "unexpected keyword argument 'max_speed'" in msg


def test_good_env_kwargs_pass():
    check_env(cartpole("env.kwargs={max_episode_steps: 50}"))


def test_async_vectorization_probes_in_process():
    # No worker process for a probe: the check must not cost a process per env.
    obs, _ = check_env(cartpole("env.vectorization=async"))
    assert obs.shape == (4,)


def test_env_factory_is_probed_instead_of_env_id():
    made = []

    def make_env() -> gym.Env:
        made.append(1)
        return gym.make("CartPole-v1")

    # The id is never made when a factory is given, so it may be anything.
    check_env(cartpole("env.id=MyOwnEnv-v0"), Factories(env=make_env))
    assert made


def test_failing_env_factory_is_named():
    def broken_env() -> gym.Env:
        raise RuntimeError("no simulator licence")

    with pytest.raises(
        ConfigError, match="env factory .*broken_env failed: .*no simulator licence"
    ):
        check_env(cartpole(), Factories(env=broken_env))


def test_unimportable_factory_reference_is_named():
    with pytest.raises(ConfigError, match="the env factory: cannot import factory 'nope:make'"):
        check_env(cartpole(), Factories(env="nope:make"))


def test_model_that_does_not_build_is_named():
    obs, act = check_env(cartpole())
    with pytest.raises(ConfigError) as info:
        check_model(cartpole("model.hidden=[0]"), obs, act)
    msg = str(info.value)
    assert msg.startswith("model: the apex_dqn model with {'hidden': [0]")
    assert "hidden widths must be >= 1" in msg


def test_algo_for_the_other_action_space_is_named():
    with pytest.raises(
        ConfigError, match=r"algo 'sac' is for Box actions .* Discrete\(2\): use apex_dqn"
    ):
        preflight(cartpole("algo=sac", "replay.table=uniform"))
    with pytest.raises(
        ConfigError,
        match=r"is for Discrete actions .* use impala, appo, ppo, apex_ddpg, sac \(",
    ):
        preflight(cartpole("env.id=Pendulum-v1"))


def test_failing_model_factory_is_named():
    class WrongNet(nn.Module):
        def __init__(self, observation_space, action_space):
            super().__init__()
            raise ValueError(f"expected 84x84 images, got {observation_space.shape}")

    with pytest.raises(ConfigError, match=r"the model factory .*WrongNet does not build .*84x84"):
        preflight(cartpole(), Factories(model=WrongNet))


def test_model_factory_is_used():
    built = []

    def qnet(observation_space, action_space) -> nn.Module:
        built.append((observation_space.shape, action_space.n))
        return nn.Linear(4, 2)

    preflight(cartpole(), Factories(model=qnet))
    assert built == [((4,), 2)]


def test_supervisor_fails_before_the_run_directory_or_any_role(tmp_path):
    from zrl.run.supervisor import Supervisor

    run_dir = tmp_path / "run"
    sup = Supervisor(cartpole("env.id=CartPol-v1"), run_dir=run_dir, inproc=True, show_status=False)
    with pytest.raises(ConfigError, match="Did you mean: `CartPole`"):
        sup.run()
    assert not run_dir.exists()
    assert sup.children == [] and sup.broker_child is None


def test_a_gaussian_policy_names_what_it_cannot_do():
    """ppo, impala and appo take Box actions (a Gaussian policy), feed-forward only: the error
    names model.core, not the action space."""
    cfg = load_config(REPO / "configs" / "pendulum_ppo.yaml", ["model.core=lstm"])
    with pytest.raises(ConfigError, match="model.core: lstm: the Gaussian policy") as exc:
        preflight(cfg)
    assert "is for Discrete actions" not in str(exc.value)
    preflight(load_config(REPO / "configs" / "pendulum_appo.yaml", ["algo=impala"]))
