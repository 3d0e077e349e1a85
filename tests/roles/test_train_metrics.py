"""Every learner and actor reports its training figures (``train`` in its metrics, once a
second): each role's algorithm part (the learner's update, the actor's policy, built from a
``LearnerSetup`` / ``ActorSetup`` without sockets) is driven for a few updates, then the role
is asked for the report it would publish."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from zrl.algos.a3c.policy import A3CPolicy
from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.apex_ddpg.policy import ApexDDPGPolicy
from zrl.algos.apex_dqn.policy import ApexDQNPolicy
from zrl.algos.api.train_stats import TrainStats
from zrl.algos.ppo.rounds import Rollout
from zrl.algos.ppo.update import PPOUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.envs.vector import EpisodeTracker, make_vector_env
from zrl.roles.actor import Actor
from zrl.roles.learner import Learner
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import sequences, unroll_trajectory
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
        "replay": {"table": "fifo" if algo in ("impala", "appo") else "prioritized"},
        "ppo": {"minibatch_size": 8, "epochs": 2},
        "ddpg": {"warmup_steps": 0},
        "sac": {"warmup_steps": 0},
    }
    if algo == "a3c":
        data["roles"]["learners"] = 0
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ExperimentConfig.model_validate(data)


class Services:
    """What a learner lends its update, without sockets (a single learner: no peers)."""

    id = "learner-0"

    def __init__(self) -> None:
        self.stop_event = threading.Event()

    def open_publisher(self, *args: Any, **kwargs: Any) -> Recorder:
        return Recorder()

    def open_subscriber(self, *args: Any, **kwargs: Any) -> Recorder:
        return Recorder()

    def tick(self) -> None:
        pass

    def follow_weights(self, model: Any) -> Any:
        raise AssertionError("learner 0 follows no one")


def bare_learner(cfg: ExperimentConfig) -> Learner:
    """A learner without the broker or a parameter server: its algorithm's update built as
    ``Learner.setup`` builds it, gathering into the learner's ``train_stats``."""
    learner = Learner("inproc://unused", index=0)
    learner.config = cfg
    torch.manual_seed(cfg.seed)
    learner.update = learner.make_update(_spaces(cfg), Services())
    return learner


def bare_actor(cfg: ExperimentConfig, index: int, seed: int = 1) -> Actor:
    """An actor without the broker or envs: its algorithm's policy built as ``Actor.setup``
    builds it (for ``env.num_envs`` envs), gathering into the actor's ``train_stats``."""
    actor = Actor("inproc://unused", index=index)
    actor.config = cfg
    actor.seed = seed
    spaces = _spaces(cfg)
    actor.num_envs = cfg.env.num_envs
    actor.model = actor.make_model(*spaces)
    actor.rng = np.random.default_rng(seed)
    actor.policy = actor.make_policy(spaces, actor.model)
    actor.envs = SimpleNamespace(close=lambda: None)  # set up: it reports its exploration
    actor.episodes = EpisodeTracker(actor.num_envs)
    return actor


def transitions(
    rng: np.random.Generator, obs_dim: int, act: np.ndarray, versions: Any = 0
) -> P.Message:
    arrays = {
        "obs": rng.standard_normal((B, obs_dim)).astype(np.float32),
        "action": act,
        "reward": rng.uniform(0, 1, B).astype(np.float32),
        "discount": np.full(B, 0.97, np.float32),
        "next_obs": rng.standard_normal((B, obs_dim)).astype(np.float32),
        "weights_version": np.broadcast_to(np.asarray(versions, np.int64), (B,)).copy(),
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
        "weight": np.ones(n, np.float32),
        "key": np.arange(n, dtype=np.int64),
    }


def rollout_arrays(rng: np.random.Generator, envs: int) -> dict[str, Any]:
    """An actor's rollout of ``envs`` envs (the ``unroll`` TRAJECTORY's arrays)."""
    a = unrolls(rng, [0] * envs)
    for name in ("weights_version", "weight", "key"):
        del a[name]
    return a


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
        "loss": 2.0,
        "grad_norm": 3.0,
        "policy_lag": 2.0,
        "policy_lag_max": 3.0,
        "td_error": 3.0,
        "td_error_max": 5.0,
    }
    assert stats.flush() == {}  # afresh after each report


def train_on(learner: Learner, msg: P.Message, version: int = 3) -> None:
    """What the learner does with a received message: hand it to the update, then train."""
    learner.update.receive(msg, version)
    assert learner.update.train(version) is not None


def test_apex_dqn_learner_reports():
    learner = bare_learner(config("apex_dqn"))
    rng = np.random.default_rng(0)
    for _ in range(3):
        train_on(learner, transitions(rng, 4, rng.integers(0, 2, B).astype(np.int64)))
    report = learner.train_metrics()
    check(report, "loss", "td_error", "td_error_max", "q_mean", "grad_norm", "update_ms", "lr")
    assert report["lr"] == learner.config.learner.lr
    assert set(learner.train_metrics()) == {"lr"}  # the means start afresh


@pytest.mark.parametrize("algo", ["apex_ddpg", "sac"])
def test_continuous_learner_reports(algo):
    learner = bare_learner(config(algo, env="Pendulum-v1"))
    rng = np.random.default_rng(0)
    for _ in range(3):
        train_on(learner, transitions(rng, 3, rng.uniform(-2, 2, (B, 1)).astype(np.float32)))
    report = learner.train_metrics()
    check(
        report,
        "loss",
        "critic_loss",
        "actor_loss",
        "td_error",
        "td_error_max",
        "q_mean",
        "grad_norm",
        "actor_grad_norm",
        "update_ms",
        "lr",
        "actor_lr",
    )
    if algo == "sac":
        check(report, "alpha", "alpha_loss", "entropy")


def replay_batch(algo: str, rng: np.random.Generator, versions: np.ndarray) -> P.Message:
    """A BATCH as a replay shard sends it to ``algo``'s learner, its items collected with
    ``versions``."""
    if algo == "r2d2":
        arrays = sequences(B, obs_dim=2, state_width=16)  # CartPoleNoVel: 2 observations
        del arrays["priority"]
        arrays.update(
            weights_version=versions,
            weight=np.ones(B, np.float32),
            key=np.arange(B, dtype=np.int64),
        )
        return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays, sender="replay-0")
    if algo == "apex_dqn":
        return transitions(rng, 4, rng.integers(0, 2, B).astype(np.int64), versions)
    return transitions(rng, 3, rng.uniform(-2, 2, (B, 1)).astype(np.float32), versions)


REPLAY_LEARNERS: dict[str, tuple[str, dict[str, Any]]] = {
    "apex_dqn": ("CartPole-v1", {}),
    "apex_ddpg": ("Pendulum-v1", {}),
    "sac": ("Pendulum-v1", {}),
    "r2d2": (
        "zrl/CartPoleNoVel-v1",
        {"model": {"core": "lstm", "core_size": 8}, "r2d2": {"sequence_length": 6, "burn_in": 2}},
    ),
}


@pytest.mark.parametrize("algo", list(REPLAY_LEARNERS))
def test_replay_learners_report_policy_lag_from_the_items_versions(algo):
    """The learner at version 5 trains on items collected with versions 1..5 and some of
    unknown version (-1: before items kept theirs), which are left out."""
    env, sections = REPLAY_LEARNERS[algo]
    learner = bare_learner(config(algo, env=env, **sections))
    rng = np.random.default_rng(0)
    first = np.array([5, 5, 4, 4, 3, 1, -1, -1] * (B // 8), np.int64)
    train_on(learner, replay_batch(algo, rng, first), version=5)
    train_on(learner, replay_batch(algo, rng, np.full(B, -1, np.int64)), version=6)
    train_on(learner, replay_batch(algo, rng, np.full(B, 6, np.int64)), version=6)
    report = learner.train_metrics()
    check(report, "policy_lag", "policy_lag_max")
    # Per batch with a known version, mean and max: (1.0 + 0.0) / 2 and 4.
    assert report["policy_lag"] == pytest.approx((np.mean([0, 0, 1, 1, 2, 4]) + 0.0) / 2)
    assert report["policy_lag_max"] == 4.0
    # A report with nothing known holds no lag at all (not a 0 that reads as fresh data).
    train_on(learner, replay_batch(algo, rng, np.full(B, -1, np.int64)), version=6)
    assert "policy_lag" not in learner.train_metrics()


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_unroll_learners_report_policy_lag(algo):
    learner = bare_learner(config(algo))
    rng = np.random.default_rng(0)
    a = unrolls(rng, [1, 3, 3])  # the learner is at version 3
    train_on(learner, P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=a), version=3)
    report = learner.train_metrics()
    check(
        report,
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "grad_norm",
        "mean_rho",
        "policy_lag",
        "policy_lag_max",
        "update_ms",
        "lr",
    )
    assert report["policy_lag"] == pytest.approx(2 / 3)
    assert report["policy_lag_max"] == 2.0
    if algo == "appo":
        check(report, "approx_kl", "clip_fraction")


def test_ppo_learner_reports_kl_clip_fraction_and_policy_lag():
    learner = bare_learner(config("ppo"))
    update = learner.update
    assert isinstance(update, PPOUpdate)
    rng = np.random.default_rng(0)
    chosen = []
    for actor in range(2):
        # Collected one version before the learner's (3).
        chosen.append(Rollout(2, actor, rollout_arrays(rng, envs=2)))
    assert update.train_round(chosen, current=3) > 0
    report = learner.train_metrics()
    check(
        report,
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "grad_norm",
        "update_ms",
        "round_s",
        "policy_lag",
        "policy_lag_max",
        "lr",
    )
    assert report["policy_lag"] == 1.0


def test_a3c_worker_and_parameter_server_report(monkeypatch):
    cfg = config("a3c")
    params = ParameterServer("inproc://unused", index=0)
    params.config = cfg
    monkeypatch.setattr(params, "open_pull", lambda *a, **k: Recorder())
    monkeypatch.setattr(params, "open_publisher", lambda *a, **k: Recorder())
    params.publisher = Recorder()
    params.served = 0  # the version starts at 0 (the default stream, made in __init__)
    params.setup_gradient_server()
    assert params.version == 1

    worker = bare_actor(cfg, index=0)
    assert isinstance(worker.policy, A3CPolicy)
    assert params.gradient_server is not None
    worker.model.load_state_dict(params.gradient_server.model.state_dict())
    r = rollout_arrays(np.random.default_rng(0), envs=2)
    out = worker.policy.finish(unroll_trajectory(r))
    assert out.kind == P.GRADIENTS
    check(worker.train_metrics(), "loss", "policy_loss", "value_loss", "entropy")

    meta = {"weights_version": 1, "actor": 0, **out.meta}  # as the actor sends it
    params.on_gradients(P.Message(P.GRADIENTS, meta=meta, arrays=out.arrays))
    check(params.train_metrics(), "grad_norm", "update_ms", "policy_lag", "policy_lag_max", "lr")


def _spaces(cfg: ExperimentConfig) -> tuple[Any, Any]:
    probe = make_vector_env(cfg.env, 1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    return spaces


def test_apex_actor_reports_episodes_and_epsilons():
    cfg = config("apex_dqn")
    actor = bare_actor(cfg, index=1)
    policy = actor.policy
    assert isinstance(policy, ApexDQNPolicy) and actor.num_envs == 2
    # Two episodes end in env 0 (returns 3 and 2), none in env 1.
    done = np.array([[False, False, True, False, True], [False] * 5])
    actor.episodes.update_trajectory(np.ones((2, T)), done, np.ones((2, T), bool))
    report = actor.train_metrics()
    check(
        report,
        "episode_return",
        "episode_return_min",
        "episode_return_max",
        "episode_length",
        "epsilon_min",
        "epsilon_max",
    )
    assert (report["episode_return"], report["episode_length"]) == (2.5, 2.5)
    assert (
        report["epsilon_min"] < report["epsilon_max"] == pytest.approx(float(policy.epsilons.max()))
    )
    # Episodes are reported once; the exploration every time.
    assert set(actor.train_metrics()) == {"epsilon_min", "epsilon_max"}


def test_ddpg_actor_reports_its_noise_scale():
    cfg = config("apex_ddpg", env="Pendulum-v1")
    actor = bare_actor(cfg, index=0)
    assert isinstance(actor.policy, ApexDDPGPolicy)
    report = actor.train_metrics()
    check(report, "noise_sigma_min", "noise_sigma_max", "warming_up")
    assert report["noise_sigma_max"] == pytest.approx(cfg.section(DDPGConfig).noise_sigma)
