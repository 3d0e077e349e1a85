"""``actor.random_policy``: uniform actions without the model, for the algorithms that have it."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from zrl.algos.kernel.sampling import CategoricalPolicy
from zrl.config.experiment import ConfigError, ExperimentConfig, config_from_dict
from zrl.testing.fakes import actor_setup


class NoModel:
    def __call__(self, *args: object) -> None:
        raise AssertionError("the random policy ran the model")


def test_random_actions_are_uniform_and_never_run_the_model():
    cfg = ExperimentConfig.model_validate(
        {"algo": "appo", "actor": {"random_policy": True}, "replay": {"table": "fifo"}}
    )
    policy = CategoricalPolicy(
        actor_setup(
            cfg, NoModel(), gym.spaces.Box(0, 255, (4, 8, 8), np.uint8), gym.spaces.Discrete(6), 4
        )
    )
    policy.begin(500, 0)
    obs = np.zeros((4, 4, 8, 8), np.uint8)
    drawn = []
    for t in range(500):
        actions, extras = policy.act(obs, t)
        assert actions.shape == (4,) and extras["logp"].dtype == np.float32
        np.testing.assert_allclose(extras["logp"], -math.log(6))
        drawn.append(actions)
    counts = np.bincount(np.concatenate(drawn), minlength=6)
    assert counts.min() > 250  # 2000 draws of 6 actions: about 333 each
    actions, _ = policy.act(obs[:2], 0, slice(2, 4))  # one env group's rows
    assert actions.shape == (2,)


@pytest.mark.parametrize("algo", ["apex_dqn", "ppo", "a3c", "sac"])
def test_algorithms_without_a_random_mode_refuse_it(algo):
    with pytest.raises(ConfigError, match=f"actor.random_policy: {algo}'s actors have no random"):
        config_from_dict({"algo": algo, "actor": {"random_policy": True}})
