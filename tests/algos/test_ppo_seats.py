"""PPO on a turn-based game played from both seats (``env.multiagent.self_play_seats: both``):
the actor policy sends the env's turn passes with its unroll (``turn_unroll``), and the
learner, told by its config (never by the message), takes only such rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.algos.test_ppo_update import (
    ACT_SPACE,
    OBS_SPACE,
    E,
    T,
    make_config,
    make_update,
    params,
    rollout_msg,
)
from zrl.algos.api.actor import Trajectory
from zrl.algos.api.learner import UpdateResult
from zrl.algos.models import build_model
from zrl.algos.ppo.policy import PPOPolicy, make_policy
from zrl.config.experiment import ExperimentConfig
from zrl.testing.fakes import actor_setup
from zrl.transport import protocol as P


def both_seats_config() -> ExperimentConfig:
    cfg = make_config()
    cfg.env.multiagent.self_play_seats = "both"
    return cfg


def with_passes(actor: int) -> P.Message:
    msg = rollout_msg(actor)
    msg.arrays["passes"] = np.random.default_rng(actor).random((E, T)) < 0.5
    return msg


def test_the_learner_of_both_seats_trains_on_turn_unrolls_only():
    up = make_update(both_seats_config())
    before = params(up.model)
    with pytest.raises(P.ProtocolError, match="passes"):
        up.receive(rollout_msg(0), 1)  # no passes: its GAE would credit the wrong seat
    up.receive(with_passes(0), 1)
    up.receive(with_passes(1), 1)
    assert isinstance(up.train(1), UpdateResult)
    assert any(not np.array_equal(before[k], v) for k, v in params(up.model).items())


def test_a_plain_learner_refuses_passes_it_would_ignore():
    up = make_update()
    with pytest.raises(P.ProtocolError, match="passes"):
        up.receive(with_passes(0), 1)


def test_the_actor_policy_sends_the_passes_the_actor_recorded():
    trajectory = Trajectory(
        obs=np.zeros((E, T, 4), np.float32),
        next_obs=None,
        action=np.zeros((E, T), np.int64),
        reward=np.zeros((E, T), np.float32),
        terminated=np.zeros((E, T), bool),
        truncated=np.zeros((E, T), bool),
        valid=np.ones((E, T), bool),
        final_obs=np.zeros((E, 4), np.float32),
        extras={"logp": np.zeros((E, T), np.float32), "passes": np.ones((E, T), bool)},
    )
    cfg = both_seats_config()
    model = build_model(OBS_SPACE, ACT_SPACE, cfg.model, "ppo")
    policy = make_policy(actor_setup(cfg, model, OBS_SPACE, ACT_SPACE, E))
    assert isinstance(policy, PPOPolicy)
    out = policy.finish(trajectory)
    assert out.arrays["passes"].all()
    del trajectory.extras["passes"]
    assert "passes" not in policy.finish(trajectory).arrays
