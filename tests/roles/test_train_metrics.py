"""Every learner and actor reports its training figures (``train`` in its metrics, once a
second): each role is driven in process without sockets for a few updates, then asked for
the report it would publish."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from zrl.config import ExperimentConfig
from zrl.envs import EpisodeTracker, make_vector_env
from zrl.roles.actor import Actor
from zrl.roles.continuous_learner import ContinuousLearner
from zrl.roles.impala_learner import ImpalaLearner
from zrl.roles.learner import Learner
from zrl.roles.onpolicy_actor import OnPolicyActor
from zrl.roles.params import ParameterServer
from zrl.roles.ppo_learner import PPOLearner, Rollout
from zrl.roles.train_stats import TrainStats
from zrl.transport import protocol as P

torch.set_num_threads(1)
B, T = 16, 5


class Recorder:
    """A socket that records what is sent and never receives."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.sock = SimpleNamespace(poll=lambda *a: 0)

    def send(self, msg: P.Message, topic: str | None = None, block: bool = True) -> bool:
        self.sent.append(msg)
        return True

    def recv(self, block: bool = True) -> None:
        return None


def config(algo: str, env: str = "CartPole-v1", **sections: Any) -> ExperimentConfig:
    data: dict[str, Any] = {
        "algo": algo,
        "seed": 3,
        "env": {"id": env, "num_envs": 2},
        "model": {"hidden": [16]},
        "roles": {"actors": 2, "replay": 0 if algo in ("ppo", "a3c") else 1},
        "actor": {"trajectory_length": T},
        "replay": {"table": "fifo" if algo == "impala" else "prioritized"},
        "ppo": {"minibatch_size": 8, "epochs": 2},
        "ddpg": {"warmup_steps": 0},
        "sac": {"warmup_steps": 0},
    }
    if algo == "a3c":
        data["roles"]["learners"] = 0
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ExperimentConfig.model_validate(data)


def bare_learner(cls: type[Learner], cfg: ExperimentConfig, monkeypatch) -> Any:
    """``Learner.setup`` without the broker or a parameter server."""
    learner = cls("inproc://unused", index=0)
    learner.config = cfg
    for opener in ("open_pull", "open_publisher", "open_subscriber"):
        monkeypatch.setattr(learner, opener, lambda *a, **k: Recorder())
    monkeypatch.setattr(learner, "send_weights", lambda: None)
    monkeypatch.setattr(learner, "tick", lambda: None)
    torch.manual_seed(cfg.seed)
    probe = make_vector_env(cfg.env, 1)
    learner.online = learner.make_model(probe.single_observation_space, probe.single_action_space)
    learner.num_actions = int(getattr(probe.single_action_space, "n", 0))
    probe.close()
    learner.setup_updates()
    learner.updates, learner.weights_version, learner.non_finite_in_a_row = 0, 3, 0
    learner.last_loss = float("nan")
    return learner


def transitions(rng: np.random.Generator, obs_dim: int, act: np.ndarray) -> P.Message:
    arrays = {
        "obs": rng.standard_normal((B, obs_dim)).astype(np.float32),
        "action": act,
        "reward": rng.uniform(0, 1, B).astype(np.float32),
        "discount": np.full(B, 0.97, np.float32),
        "next_obs": rng.standard_normal((B, obs_dim)).astype(np.float32),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays, sender="replay-0")


def unrolls(rng: np.random.Generator, versions: list[int], obs_dim: int = 4) -> dict[str, Any]:
    n = len(versions)
    return {
        "obs": rng.standard_normal((n, T, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 2, (n, T)).astype(np.int64),
        "logp": np.full((n, T), np.log(0.5), np.float32),
        "reward": rng.uniform(0, 1, (n, T)).astype(np.float32),
        "terminated": np.zeros((n, T), bool),
        "truncated": np.zeros((n, T), bool),
        "valid": np.ones((n, T), bool),
        "bootstrap_obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
        "weights_version": np.array(versions, np.int64),
    }


def check(report: dict[str, float], *keys: str) -> None:
    missing = [k for k in keys if k not in report]
    assert not missing, f"missing {missing} in {sorted(report)}"
    assert all(isinstance(v, float) and math.isfinite(v) for v in report.values()), report


def test_train_stats_means_maxima_tensors_and_reset():
    stats = TrainStats()
    stats.add(loss=1.0, grad_norm=torch.tensor(2.0))
    stats.add(loss=3.0, grad_norm=torch.tensor(4.0), actor_loss=math.nan, other=None)
    stats.add_with_max(policy_lag=1)
    stats.add_with_max(policy_lag=3)
    stats.add_array("td_error", np.array([1.0, 5.0], np.float32))
    assert stats.flush() == {
        "loss": 2.0, "grad_norm": 3.0, "policy_lag": 2.0, "policy_lag_max": 3.0,
        "td_error": 3.0, "td_error_max": 5.0,
    }  # fmt: skip
    assert stats.flush() == {}  # afresh after each report


def test_apex_dqn_learner_reports(monkeypatch):
    learner = bare_learner(Learner, config("apex_dqn"), monkeypatch)
    rng = np.random.default_rng(0)
    for _ in range(3):
        learner.on_batch(transitions(rng, 4, rng.integers(0, 2, B).astype(np.int64)))
    report = learner.train_metrics()
    check(report, "loss", "td_error", "td_error_max", "q_mean", "grad_norm", "update_ms", "lr")
    assert report["lr"] == learner.config.learner.lr
    assert set(learner.train_metrics()) == {"lr"}  # the means start afresh


@pytest.mark.parametrize("algo", ["apex_ddpg", "sac"])
def test_continuous_learner_reports(algo, monkeypatch):
    learner = bare_learner(ContinuousLearner, config(algo, env="Pendulum-v1"), monkeypatch)
    rng = np.random.default_rng(0)
    for _ in range(3):
        learner.on_batch(transitions(rng, 3, rng.uniform(-2, 2, (B, 1)).astype(np.float32)))
    report = learner.train_metrics()
    check(report, "loss", "critic_loss", "actor_loss", "td_error", "td_error_max", "q_mean",
          "grad_norm", "actor_grad_norm", "update_ms", "lr", "actor_lr")  # fmt: skip
    if algo == "sac":
        check(report, "alpha", "alpha_loss", "entropy")


def test_impala_learner_reports_policy_lag(monkeypatch):
    learner = bare_learner(ImpalaLearner, config("impala"), monkeypatch)
    rng = np.random.default_rng(0)
    a = unrolls(rng, [1, 3, 3])  # the learner is at version 3
    del a["truncated"]
    learner.on_batch(P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=a))
    report = learner.train_metrics()
    check(report, "loss", "policy_loss", "value_loss", "entropy", "grad_norm", "mean_rho",
          "policy_lag", "update_ms", "lr")  # fmt: skip
    assert report["policy_lag"] == pytest.approx(2 / 3)


def test_ppo_learner_reports_kl_clip_fraction_and_policy_lag(monkeypatch):
    learner = bare_learner(PPOLearner, config("ppo"), monkeypatch)
    rng = np.random.default_rng(0)
    chosen = []
    for actor in range(2):
        a = unrolls(rng, [3, 3])
        del a["weights_version"]
        chosen.append(Rollout(2, actor, a))  # collected one version before the learner's
    learner.train_round(chosen)
    report = learner.train_metrics()
    check(report, "loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
          "grad_norm", "update_ms", "round_s", "policy_lag", "policy_lag_max", "lr")  # fmt: skip
    assert report["policy_lag"] == 1.0


def test_a3c_worker_and_parameter_server_report(monkeypatch):
    cfg = config("a3c")
    params = ParameterServer("inproc://unused", index=0)
    params.config = cfg
    monkeypatch.setattr(params, "open_pull", lambda *a, **k: Recorder())
    monkeypatch.setattr(params, "open_publisher", lambda *a, **k: Recorder())
    params.publisher = Recorder()
    params.version, params.served = 0, 0
    params.setup_gradient_server()
    assert params.version == 1

    worker = OnPolicyActor("inproc://unused", index=0)
    worker.config = cfg
    worker.model = params.make_model(*_spaces(cfg))
    worker.model.load_state_dict(params.model.state_dict())
    rollout = unrolls(np.random.default_rng(0), [1, 1])
    del rollout["weights_version"]
    msg = worker.gradient_message(rollout, {"weights_version": 1, "actor": 0})
    check(worker.train_metrics(), "loss", "policy_loss", "value_loss", "entropy")

    params.on_gradients(P.Message(P.GRADIENTS, meta=msg.meta, arrays=msg.arrays))
    check(params.train_metrics(), "grad_norm", "update_ms", "policy_lag", "policy_lag_max", "lr")


def _spaces(cfg: ExperimentConfig) -> tuple[Any, Any]:
    probe = make_vector_env(cfg.env, 1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    return spaces


def test_apex_actor_reports_episodes_and_epsilons():
    cfg = config("apex_dqn")
    actor = Actor("inproc://unused", index=1)
    actor.config = cfg
    actor.actor_index, actor.num_envs, actor.seed = 1, 2, 1
    actor.envs = SimpleNamespace(single_action_space=SimpleNamespace(n=2))
    actor.setup_exploration()
    actor.episodes = EpisodeTracker(2)
    # Two episodes end in env 0 (returns 3 and 2), none in env 1.
    done = np.array([[False, False, True, False, True], [False] * 5])
    actor.episodes.update_trajectory(np.ones((2, T)), done, np.ones((2, T), bool))
    report = actor.train_metrics()
    check(report, "episode_return", "episode_return_min", "episode_return_max",
          "episode_length", "epsilon_min", "epsilon_max")  # fmt: skip
    assert (report["episode_return"], report["episode_length"]) == (2.5, 2.5)
    assert (
        report["epsilon_min"] < report["epsilon_max"] == pytest.approx(float(actor.epsilons.max()))
    )
    # Episodes are reported once; the exploration every time.
    assert set(actor.train_metrics()) == {"epsilon_min", "epsilon_max"}


def test_ddpg_actor_reports_its_noise_scale():
    from zrl.roles.continuous_actor import ContinuousActor

    cfg = config("apex_ddpg", env="Pendulum-v1")
    envs = make_vector_env(cfg.env)
    try:
        actor = ContinuousActor("inproc://unused", index=0)
        actor.config, actor.actor_index, actor.seed = cfg, 0, 1
        actor.envs, actor.num_envs, actor.env_steps = envs, envs.num_envs, 0
        actor.setup_exploration()
        actor.episodes = EpisodeTracker(actor.num_envs)
        report = actor.train_metrics()
    finally:
        envs.close()
    check(report, "noise_sigma_min", "noise_sigma_max", "warming_up")
    assert report["noise_sigma_max"] == pytest.approx(cfg.ddpg.noise_sigma)
