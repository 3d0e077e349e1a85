"""Learner updates driven directly: a config per algorithm, a real ``LearnerSetup``, hand-built
BATCH messages of transitions or unrolls, and the check that a non-finite loss drops its batch.
Shared by ``tests/algos/test_updates.py``, ``test_impala_update.py`` and ``test_appo.py``."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.api.learner import LearnerSetup, LearnerUpdate, NonFiniteLossError, UpdateResult
from zrl.algos.models import experiment_model
from zrl.config.experiment import ExperimentConfig
from zrl.testing.fakes import learner_setup
from zrl.transport import protocol as P

B, T = 8, 5
SHARD = "replay-0"
ENV = {
    "apex_dqn": "CartPole-v1",
    "impala": "CartPole-v1",
    "appo": "CartPole-v1",
    "apex_ddpg": "Pendulum-v1",
}


def config(algo: str, **sections: dict[str, Any]) -> ExperimentConfig:
    data: dict[str, Any] = {
        "algo": algo,
        "seed": 3,
        "env": {"id": ENV.get(algo, "Pendulum-v1")},
        "model": {"hidden": [16]},
        "roles": {"actors": 1, "replay": 1, "learners": 1},
        "replay": {"table": "fifo" if algo in ("impala", "appo") else "prioritized"},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ExperimentConfig.model_validate(data)


def setup(
    cfg: ExperimentConfig, seed: int = 0, index: int = 0, services: Any = None
) -> LearnerSetup:
    torch.manual_seed(seed)
    env = gym.make(cfg.env.id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    model = experiment_model(cfg, obs_space, act_space)
    return learner_setup(cfg, model, obs_space, act_space, index=index, services=services)


class GroupServices:
    """What the learner role lends the updates of a learner group, without sockets: rank 0's
    heartbeat info is found in ``registry`` (as the broker's STATUS shows it)."""

    def __init__(self, index: int, registry: dict[str, dict[str, Any]]) -> None:
        self.id = f"learner-{index}"
        self.advertise = "127.0.0.1"
        self.stop_event = threading.Event()
        self.registry = registry
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1

    def role_info(self, role_id: str) -> dict[str, Any] | None:
        return self.registry.get(role_id)

    def take_input(self) -> bool:
        return False  # the test hands each update its batches


def batch(arrays: dict[str, np.ndarray], shard: Any = SHARD) -> P.Message:
    return P.Message(P.BATCH, meta={"shard": shard, "table_size": 100}, arrays=arrays)


def unroll_batch(rng: np.random.Generator, versions: list[int]) -> dict[str, np.ndarray]:
    n = len(versions)
    return {
        "obs": rng.normal(size=(n, T, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=(n, T)).astype(np.int64),
        "logp": np.full((n, T), np.log(0.5), np.float32),
        "reward": np.ones((n, T), np.float32),
        "terminated": np.zeros((n, T), bool),
        "truncated": np.zeros((n, T), bool),
        "valid": np.ones((n, T), bool),
        "bootstrap_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "weights_version": np.array(versions, np.int64),
        "weight": np.ones(n, np.float32),
        "key": np.arange(n, dtype=np.int64),
    }


def transitions(rng: np.random.Generator, obs_dim: int, action: np.ndarray) -> dict[str, Any]:
    return {
        "obs": rng.normal(size=(B, obs_dim)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=B).astype(np.float32),
        "discount": np.full(B, 0.9, np.float32),
        "next_obs": rng.normal(size=(B, obs_dim)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": rng.uniform(0.5, 1.0, size=B).astype(np.float32),
        "key": np.arange(100, 100 + B, dtype=np.int64),
    }


def dqn_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return transitions(rng, 4, rng.integers(0, 2, size=B).astype(np.int64))


def continuous_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return transitions(rng, 3, rng.uniform(-2.0, 2.0, size=(B, 1)).astype(np.float32))


def trained(update: LearnerUpdate, msg: P.Message, version: int = 0) -> UpdateResult:
    update.receive(msg, version)
    result = update.train(version)
    assert result is not None
    return result


def layout(rng: np.random.Generator, B: int, T: int, p_term: float, p_trunc: float):
    """Env-major [B, T] episode ends and valid flags as a NEXT_STEP-autoreset actor records
    them: the step after an episode end is invalid; t=0 may be invalid too."""
    term = np.zeros((B, T), bool)
    trunc = np.zeros((B, T), bool)
    valid = np.ones((B, T), bool)
    for b in range(B):
        for t in range(T):
            valid[b, t] = rng.random() < 0.7 if t == 0 else not (term[b, t - 1] or trunc[b, t - 1])
            if valid[b, t]:
                term[b, t] = rng.random() < p_term
                trunc[b, t] = not term[b, t] and rng.random() < p_trunc
    return term, trunc, valid


def check_non_finite_batch_is_dropped(update: Any, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` (finite: ``receive`` refuses NaN) make a non-finite loss: ``train`` raises
    NonFiniteLossError naming the shard before any optimizer step; the batch is dropped."""
    before = {k: v.clone() for k, v in update.model.state_dict().items()}
    update.receive(batch(arrays, shard="replay-3"), 0)
    with pytest.raises(NonFiniteLossError) as info:
        update.train(0)
    assert info.value.source == "a batch from replay-3"
    assert all(torch.equal(before[k], v) for k, v in update.model.state_dict().items())
    assert not update.optimizer.state  # no step was taken
    assert update.train(0) is None  # dropped, not retried
    assert update.updates == 0
