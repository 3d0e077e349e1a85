"""The example scripts in examples/: each one's own model, built as the roles build it (from
the factories as shipped to other hosts), trained for a few steps by its algorithm's real
learner update on fake data, and acting through its algorithm's real actor policy and the
evaluator's greedy play. No sockets, no processes, no env steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.api.learner import UpdateResult
from zrl.algos.models import build_model, experiment_model
from zrl.algos.registry import get_algorithm
from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.nets.discrete import greedy_actions
from zrl.run.experiment import Experiment, load_experiment
from zrl.testing.fakes import actor_setup, learner_setup
from zrl.transport import protocol as P

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
B = 32  # replay batch size
E = 4  # envs of the actor
SCRIPTS = {
    "cartpole_script.py": "apex_dqn",
    "custom_actor_critic.py": "ppo",
    "custom_ddpg.py": "apex_ddpg",
    "custom_sac.py": "sac",
}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(SCRIPTS)


def load(script: str) -> tuple[Experiment, ExperimentConfig, Any, Any, Any]:
    """The script's experiment (imported as ``zrl run`` imports it), its config (few PPO
    epochs), the env's spaces and the model factory as a role on another host gets it."""
    experiment = load_experiment(EXAMPLES / script)
    assert Path(str(experiment.config)).is_file()  # the relative path found the config
    cfg = experiment.resolved_config(["ppo.epochs=2"])
    assert cfg.algo == SCRIPTS[script]
    env = experiment.env() if callable(experiment.env) else gym.make(cfg.env.id)
    spaces = env.observation_space, env.action_space
    env.close()
    factories = experiment.factories
    assert factories.needs_pickle() and factories.model is not None
    shipped = Factories.from_wire(factories.references, factories.pickled())
    return experiment, cfg, *spaces, shipped.model_fn()


def make_model(cfg: ExperimentConfig, obs_space: Any, act_space: Any, model_fn: Any) -> Any:
    torch.manual_seed(0)
    model = experiment_model(cfg, obs_space, act_space, model_fn)
    default = build_model(obs_space, act_space, cfg.model, cfg.algo)  # zrl's own network
    assert type(model) is not type(default)
    return model


def learner_update(cfg: ExperimentConfig, model: Any, obs_space: Any, act_space: Any) -> Any:
    algorithm = get_algorithm(cfg.algo)
    update = algorithm.update
    assert update is not None
    return update(learner_setup(cfg, model, obs_space, act_space))


def actor_policy(cfg: ExperimentConfig, model: Any, obs_space: Any, act_space: Any) -> Any:
    algorithm = get_algorithm(cfg.algo)
    return algorithm.policy(actor_setup(cfg, model, obs_space, act_space, E))


def observations(rng: np.random.Generator, space: gym.spaces.Box, n: int) -> np.ndarray:
    low = np.maximum(space.low, -2.0)
    high = np.minimum(space.high, 2.0)
    return rng.uniform(low, high, size=(n, *space.shape)).astype(np.float32)


def transition_batch(rng: np.random.Generator, obs_space: Any, action: np.ndarray) -> P.Message:
    """A replay BATCH of n-step transitions, as a shard sends it."""
    arrays = {
        "obs": observations(rng, obs_space, B),
        "action": action,
        "reward": rng.normal(size=B).astype(np.float32),
        "discount": np.full(B, 0.9, np.float32),
        "next_obs": observations(rng, obs_space, B),
        "weights_version": np.zeros(B, np.int64),
        "weight": rng.uniform(0.5, 1.0, size=B).astype(np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0", "table_size": 1000}, arrays=arrays)


def rollout(
    rng: np.random.Generator, cfg: ExperimentConfig, obs_space: Any, actor: int
) -> P.Message:
    """A PPO TRAJECTORY (``unroll``) of one actor under weights version 1."""
    n, t, num_actions = cfg.env.num_envs, cfg.actor.trajectory_length, 2
    terminated = np.zeros((n, t), bool)
    terminated[0, t // 2] = True
    valid = np.ones((n, t), bool)
    valid[0, t // 2 + 1] = False  # the reset step after the episode end
    arrays = {
        "obs": observations(rng, obs_space, n * t).reshape(n, t, -1),
        "action": rng.integers(num_actions, size=(n, t)).astype(np.int64),
        "logp": np.full((n, t), -math.log(num_actions), np.float32),
        "reward": np.ones((n, t), np.float32),
        "terminated": terminated,
        "truncated": np.zeros((n, t), bool),
        "valid": valid,
        "bootstrap_obs": observations(rng, obs_space, n),
    }
    meta = {"weights_version": 1, "actor": actor, "env_steps": n * t}
    return P.Message(P.TRAJECTORY, meta=meta, arrays=arrays, sender=f"actor-{actor}")


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(update: Any, messages: list[P.Message], version: int) -> list[UpdateResult]:
    results = []
    for msg in messages:
        update.receive(msg, version)
        result = update.train(version)
        if result is not None:
            results.append(result)
    return results


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_learner_trains_the_example_model(script: str) -> None:
    _, cfg, obs_space, act_space, model_fn = load(script)
    model = make_model(cfg, obs_space, act_space, model_fn)
    update = learner_update(cfg, model, obs_space, act_space)
    before = weights(model)
    rng = np.random.default_rng(1)
    if cfg.algo == "apex_dqn":
        actions = [rng.integers(act_space.n, size=B).astype(np.int64) for _ in range(3)]
        results = train(update, [transition_batch(rng, obs_space, a) for a in actions], 0)
        assert len(results) == 3
    elif cfg.algo == "ppo":
        rollouts = [rollout(rng, cfg, obs_space, actor) for actor in range(cfg.roles.actors)]
        results = train(update, rollouts, 1)  # one round: a rollout from every actor
        assert len(results) == 1 and results[0].updates >= 2
    else:
        low, high = act_space.low, act_space.high
        actions = [rng.uniform(low, high, size=(B, *act_space.shape)).astype(np.float32)]
        results = train(update, [transition_batch(rng, obs_space, a) for a in actions * 3], 0)
        assert len(results) == 3
    assert all(math.isfinite(r.loss) for r in results)
    after = weights(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert changed == trainable  # every parameter trained (policy and critics), no buffer
    for r in results:
        if r.priorities is not None:  # prioritized replay: new priorities of the batch
            assert r.priorities.priorities.shape == (B,)
            assert np.isfinite(r.priorities.priorities).all()


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_actor_and_evaluator_act_with_the_example_model(script: str) -> None:
    _, cfg, obs_space, act_space, model_fn = load(script)
    model = make_model(cfg, obs_space, act_space, model_fn)
    policy = actor_policy(cfg, model, obs_space, act_space)
    obs = observations(np.random.default_rng(2), obs_space, E)
    policy.begin(1, 10**9)  # past any warm-up: the model acts
    actions, extras = policy.act(obs, 0)
    with torch.no_grad():
        greedy = greedy_actions(model, torch.from_numpy(obs)).numpy()  # the evaluator's
    if isinstance(act_space, gym.spaces.Discrete):
        for a in (actions, greedy):
            assert a.shape == (E,) and np.issubdtype(a.dtype, np.integer)
            assert ((a >= 0) & (a < act_space.n)).all()
        if cfg.algo == "ppo":
            assert extras["logp"].shape == (E,) and (extras["logp"] <= 0).all()
        return
    shape = (E, *act_space.shape)
    assert actions.shape == shape and actions.dtype == act_space.dtype
    assert greedy.shape == shape
    for a in (actions, greedy):
        assert np.isfinite(a).all() and (a >= act_space.low).all() and (a <= act_space.high).all()
    # Ape-X initial priorities: Q1(s, a), and the bootstrap Q(s, mu(s)) (min of twin critics).
    assert policy.bootstrap_q(obs, actions).shape == (E,)
    assert np.isfinite(policy.bootstrap_q(obs)).all()
    if cfg.algo == "sac":
        with torch.no_grad():
            sampled, logp = model.sample(torch.from_numpy(obs))
        assert sampled.shape == shape and logp.shape == (E,) and torch.isfinite(logp).all()
