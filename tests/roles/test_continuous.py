"""Ape-X DDPG and SAC in the generic roles: bounds clipping, NaN detection, continuous replay,
the learner.

Most tests drive the generic ``Actor.collect`` (with the algorithm's policy, a
``ContinuousPolicy``) and the generic ``Learner``'s ``receive`` and ``train`` (with its update, a
``ContinuousUpdate``) directly on
role objects that never connect (no broker: the learner's input and publishers are replaced by
stand-ins), so a stub model or env can be injected; one test runs a real actor in-process.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from torch import nn

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.apex_ddpg.policy import ApexDDPGPolicy
from zrl.algos.apex_ddpg.update import ApexDDPGUpdate
from zrl.algos.api.actor import ActorSetup
from zrl.algos.api.train_stats import TrainStats
from zrl.algos.kernel.continuous import ContinuousPolicy, ContinuousUpdate
from zrl.algos.models import build_model
from zrl.algos.registry import get_algorithm
from zrl.algos.sac.config import SACConfig
from zrl.algos.sac.policy import SACPolicy
from zrl.algos.sac.update import SACLearnerUpdate
from zrl.config.experiment import ConfigError, ExperimentConfig, config_from_dict
from zrl.envs.vector import EpisodeTracker, make_vector_env
from zrl.nets.continuous import DDPGModel, SACModel
from zrl.replay.assemble import assemble_transitions
from zrl.roles import role_class
from zrl.roles.actor import Actor
from zrl.roles.errors import RoleError
from zrl.roles.evaluation import greedy_returns
from zrl.roles.insert_acks import InsertAcks
from zrl.roles.learner import Learner
from zrl.testing.fakes import as_message
from zrl.transport import protocol as P

torch.set_num_threads(1)

E, T, B = 3, 8, 16
LOW, HIGH = -2.0, 2.0  # Pendulum-v1 torque bounds


def config(algo: str, **sections: Any) -> ExperimentConfig:
    data: dict[str, Any] = {
        "name": "continuous-test",
        "algo": algo,
        "seed": 4,
        "env": {"id": "Pendulum-v1", "num_envs": E},
        "model": {"hidden": [16]},
        "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
        "roles": {"actors": 2},
        "actor": {"trajectory_length": T},
        "replay": {"table": "prioritized", "n_step": 3, "gamma": 0.9},
        "learner": {"publish_interval": 3},
        "ddpg": {"warmup_steps": 0},
        "sac": {"warmup_steps": 0},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ExperimentConfig.model_validate(data)


# --- a bare actor: the generic collect() with injected envs and models -----------------------


class Recording:
    """A vector env that records every action it is stepped with."""

    def __init__(self, envs: Any) -> None:
        self.envs = envs
        self.actions: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.envs, name)

    def step(self, actions: np.ndarray) -> Any:
        self.actions.append(np.array(actions))
        return self.envs.step(actions)


class StubModel(nn.Module):
    """A policy that outputs ``value`` (far outside the bounds, or NaN); zero Q-values."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        signs = torch.where(torch.arange(len(obs)) % 2 == 0, 1.0, -1.0)
        return (signs * self.value)[:, None].expand(len(obs), 1).clone()

    def q1(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs))

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.zeros(len(obs)), None


class NonFiniteOnce(gym.Wrapper):
    """Pendulum whose ``at``-th step returns a NaN observation (or reward), once."""

    def __init__(self, what: str, at: int) -> None:
        super().__init__(gym.make("Pendulum-v1"))
        self.what, self.at, self.steps = what, at, 0

    def step(self, action: Any) -> Any:
        obs, r, term, trunc, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at:
            if self.what == "observation":
                obs = np.full_like(obs, np.nan)
            else:
                r = float("nan")
        return obs, r, term, trunc, info


def actor_setup(cfg: ExperimentConfig, envs: Any, model: nn.Module, index: int = 0) -> ActorSetup:
    """What ``Actor.setup`` gives the policy, for actor ``index`` stepping ``envs``."""
    seed = 1000 + index
    return ActorSetup(
        config=cfg,
        observation_space=envs.single_observation_space,
        action_space=envs.single_action_space,
        num_envs=envs.num_envs,
        model=model,
        actor_index=index,
        seed=seed,
        rng=np.random.default_rng(seed),
        log=logging.getLogger("zrl.actor"),
        train_stats=TrainStats(),
    )


def make_policy(setup: ActorSetup) -> ContinuousPolicy:
    """The algorithm's policy, as the registry names it."""
    algorithm = get_algorithm(setup.config.algo)
    policy = algorithm.policy(setup)
    assert isinstance(policy, ContinuousPolicy)
    return policy


def bare_actor(cfg: ExperimentConfig, envs: Any, model: nn.Module, index: int = 0) -> Actor:
    """``Actor.setup`` without sockets: the generic actor and its policy, what ``collect``
    needs."""
    actor = Actor("inproc://unused", index=index)
    actor.config = cfg
    actor.seed = 1000 + index
    actor.rng = np.random.default_rng(actor.seed)
    actor.envs = envs
    actor.num_envs = envs.num_envs
    actor.model = model
    actor.weights = SimpleNamespace(version=0)  # type: ignore[assignment]
    spaces = (envs.single_observation_space, envs.single_action_space)
    actor.policy = actor.make_policy(spaces, actor.model)
    assert isinstance(actor.policy, ContinuousPolicy)
    obs, _ = envs.reset(seed=actor.seed)
    actor.obs = np.asarray(obs, np.float32).reshape(actor.num_envs, -1)
    actor.needs_reset = np.zeros(actor.num_envs, bool)
    actor.episodes = EpisodeTracker(actor.num_envs)
    actor.env_steps = actor.trajectories = actor.env_errors = 0
    # The credit window's state, for heartbeat_info (nothing is ever sent).
    actor.credit = InsertAcks(cfg.actor.max_in_flight, actor.log, lambda: 0)
    actor.blocked_since = None
    return actor


def pendulums(cfg: ExperimentConfig) -> Recording:
    return Recording(make_vector_env(cfg.env))


def policy_of(actor: Actor) -> ContinuousPolicy:
    assert isinstance(actor.policy, ContinuousPolicy)
    return actor.policy


@pytest.mark.parametrize("algo", ["apex_ddpg", "sac"])
def test_actions_are_always_clipped_to_the_bounds(algo):
    cfg = config(algo)
    envs = pendulums(cfg)
    actor = bare_actor(cfg, envs, StubModel(1e6))
    msgs = [actor.collect() for _ in range(3)]
    envs.close()
    stepped = np.stack(envs.actions)
    assert stepped.shape == (3 * T, E, 1)
    assert np.all(stepped >= LOW) and np.all(stepped <= HIGH)
    assert set(np.unique(stepped)) == {LOW, HIGH}  # the huge outputs landed on the bounds
    for msg in msgs:
        assert msg is not None
        a = msg.arrays["action"]
        assert a.dtype == np.float32 and a.shape == (E, T, 1)
        assert np.all(a >= LOW) and np.all(a <= HIGH)
        items, priorities = assemble_transitions(as_message(msg.arrays), 3, 0.9, continuous=True)
        assert items["action"].dtype == np.float32 and items["action"].shape[1:] == (1,)
        assert np.all(np.isfinite(priorities))


def test_warmup_actions_are_uniform_inside_the_bounds():
    cfg = config("sac", sac={"warmup_steps": 10_000})
    envs = pendulums(cfg)
    actor = bare_actor(cfg, envs, StubModel(float("nan")))  # never asked during warm-up
    assert actor.collect() is not None
    envs.close()
    stepped = np.concatenate(envs.actions)
    assert np.all(stepped >= LOW) and np.all(stepped <= HIGH)
    assert stepped.std() > 0.5  # spread over the box, not a constant
    assert actor.heartbeat_info()["warming_up"] is True


def test_ddpg_noise_scale_differs_per_env_slot_ape_x_style():
    cfg = config("apex_ddpg", ddpg={"noise_sigma": 0.4, "noise_alpha": 2.0})
    envs = [make_vector_env(cfg.env) for _ in range(2)]
    policies = [make_policy(actor_setup(cfg, e, StubModel(0.0), i)) for i, e in enumerate(envs)]
    sigmas = np.concatenate([p.sigmas for p in policies])
    for e in envs:
        e.close()
    # Slot k of N = 6: 0.4 ** (1 + 2 k / 5), from the widest to the narrowest.
    np.testing.assert_allclose(sigmas, 0.4 ** (1 + 2 * np.arange(6) / 5), rtol=1e-6)
    # The noise really is per slot: a zero policy's actions spread with the slot's sigma.
    envs2 = pendulums(cfg)
    actor = bare_actor(cfg, envs2, StubModel(0.0))
    for _ in range(40):
        actor.collect()
    envs2.close()
    spread = np.stack(envs2.actions).std(axis=0)[:, 0]  # per env slot
    np.testing.assert_allclose(spread, policy_of(actor).sigmas * (HIGH - LOW) / 2, rtol=0.15)


def test_nan_action_is_never_clipped_into_a_bound():
    cfg = config("apex_ddpg")
    envs = pendulums(cfg)
    actor = bare_actor(cfg, envs, StubModel(float("nan")))
    assert actor.collect() is None  # trajectory dropped, envs reset
    envs.close()
    assert envs.actions == []
    assert actor.env_errors == 1


@pytest.mark.parametrize("what", ["observation", "reward"])
def test_nan_from_the_env_is_detected_reported_and_dropped(what, caplog):
    cfg = config("sac")
    vec = gym.vector.SyncVectorEnv(
        [lambda: NonFiniteOnce(what, at=5)] * E, autoreset_mode=AutoresetMode.NEXT_STEP
    )
    actor = bare_actor(
        cfg,
        vec,
        build_model(vec.single_observation_space, vec.single_action_space, cfg.model, "sac"),
    )
    actor.id = "actor-0"
    actor.env_steps = 96
    with caplog.at_level(logging.WARNING, logger="zrl.actor"):
        assert actor.collect() is None
    assert actor.non_finite_env == 1 and actor.env_errors == 1
    assert actor.heartbeat_info()["non_finite_env"] == 1
    # Reported with the role and the env step (96 before, + 4 steps of 3 envs).
    assert f"actor-0 at env step {96 + 4 * E}" in caplog.text
    assert f"non-finite {what}" in caplog.text
    # The envs were reset and collection goes on with finite data.
    msg = actor.collect()
    vec.close()
    assert msg is not None
    assemble_transitions(as_message(msg.arrays), 3, 0.9, continuous=True)


@pytest.mark.parametrize("twin", [False, True])
def test_initial_priorities_from_the_actors_own_critics(twin):
    cfg = config("apex_ddpg", ddpg={"twin": twin})
    envs = pendulums(cfg)
    model = build_model(
        envs.single_observation_space, envs.single_action_space, cfg.model, cfg.algo, twin=twin
    )
    assert isinstance(model, DDPGModel) and model.twin == twin
    actor = bare_actor(cfg, envs, model)
    msg = actor.collect()
    envs.close()
    assert msg is not None
    p, valid = msg.arrays["priority"], msg.arrays["valid"]
    assert np.all(np.isfinite(p)) and np.all(p >= 0) and np.all(p[~valid] == 0)
    assert np.any(p[valid] > 0)


# --- replay -----------------------------------------------------------------------------------


def continuous_trajectory(act_dim: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.standard_normal((2, 5, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, (2, 5, act_dim)).astype(np.float32),
        "reward": rng.standard_normal((2, 5)).astype(np.float32),
        "terminated": np.zeros((2, 5), bool),
        "truncated": np.zeros((2, 5), bool),
        "valid": np.ones((2, 5), bool),
        "next_obs": rng.standard_normal((2, 5, 3)).astype(np.float32),
        "priority": np.ones((2, 5), np.float32),
    }


def test_replay_assembles_continuous_trajectories():
    a = continuous_trajectory()
    items, priorities = assemble_transitions(as_message(a), 1, 0.9, continuous=True)
    assert items["action"].dtype == np.float32 and items["action"].shape == (10, 2)
    np.testing.assert_array_equal(items["action"], a["action"].reshape(10, 2))
    assert priorities.shape == (10,)


@pytest.mark.parametrize(
    "change, continuous",
    [
        ({"action": np.zeros((2, 5), np.int64)}, True),  # DQN actions to a continuous replay
        ({"action": np.zeros((2, 5, 2), np.float64)}, True),
        ({"action": np.full((2, 5, 2), np.nan, np.float32)}, True),
        ({"action": np.full((2, 5, 2), np.inf, np.float32)}, True),
        ({"obs": np.full((2, 5, 3), np.nan, np.float32)}, True),
        ({"reward": np.full((2, 5), np.nan, np.float32)}, True),
        ({"action": np.zeros((2, 4, 2), np.float32)}, True),
        ({"action": np.zeros((2, 5, 0), np.float32)}, True),
        ({}, False),  # float actions to a DQN replay: unchanged validation rejects them
    ],
)
def test_replay_rejects_bad_continuous_trajectories(change, continuous):
    with pytest.raises(P.ProtocolError):
        assemble_transitions(as_message({**continuous_trajectory(), **change}), 3, 0.9, continuous)


# --- the learner ------------------------------------------------------------------------------


class Recorder:
    """Stands in for a socket: records what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[P.Message, str | None]] = []

    def send(self, msg: P.Message, topic: str | None = None, block: bool = True) -> bool:
        self.sent.append((msg, topic))
        return True


class Input:
    """Stands in for the learner's PULL ``batches``: hands out what ``feed`` queued and records
    what the learner drops (sender, reason)."""

    def __init__(self) -> None:
        self.queue: deque[P.Message] = deque()
        self.dropped: list[tuple[str, str]] = []

    def recv(self, block: bool = True) -> tuple[None, P.Message] | None:
        return (None, self.queue.popleft()) if self.queue else None

    def drop(self, sender: str, reason: str) -> None:
        self.dropped.append((sender, reason))


def bare_learner(cfg: ExperimentConfig, monkeypatch) -> Learner:
    """``Learner.setup`` without the broker or a parameter server: the generic learner with
    the algorithm's update; its input and publishers are stand-ins."""
    learner = Learner("inproc://unused", index=0)
    learner.config = cfg
    monkeypatch.setattr(learner, "open_pull", lambda *a, **k: Input())
    monkeypatch.setattr(learner, "open_publisher", lambda *a, **k: Recorder())
    algorithm = get_algorithm(cfg.algo)
    learner.open_input(algorithm.wiring.learner_input)
    torch.manual_seed(cfg.seed)
    probe = make_vector_env(cfg.env, 1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    learner.update = learner.make_update(spaces)
    assert isinstance(learner.update, ContinuousUpdate)
    learner.weights_version = 3
    learner.published = 0  # type: ignore[attr-defined]

    def send_weights() -> None:
        learner.published += 1  # type: ignore[attr-defined]

    monkeypatch.setattr(learner, "send_weights", send_weights)
    return learner


def batch(rng: np.random.Generator, first_key: int = 0, **changes: Any) -> P.Message:
    arrays = {
        "obs": rng.standard_normal((B, 3)).astype(np.float32),
        "action": rng.uniform(LOW, HIGH, (B, 1)).astype(np.float32),
        "reward": rng.uniform(-10, 0, B).astype(np.float32),
        "discount": np.where(rng.random(B) < 0.1, 0.0, 0.9**3).astype(np.float32),
        "next_obs": rng.standard_normal((B, 3)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": rng.uniform(0.1, 1.0, B).astype(np.float32),
        "key": np.arange(first_key, first_key + B, dtype=np.int64),
        **changes,
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays, sender="replay-0")


def update_of(learner: Learner) -> ContinuousUpdate:
    assert isinstance(learner.update, ContinuousUpdate)
    return learner.update


def feed(learner: Learner, msg: P.Message) -> None:
    """What one learner step does with one batch: receive it (ack, validate, keep), train."""
    learner.input.queue.append(msg)  # type: ignore[attr-defined]
    assert learner.receive() == 1
    learner.train()


def dropped(learner: Learner) -> list[tuple[str, str]]:
    return learner.input.dropped  # type: ignore[attr-defined,no-any-return]


def snapshot(learner: Learner) -> dict[str, torch.Tensor]:
    update = update_of(learner)
    state = {f"online.{k}": v.clone() for k, v in learner.online.state_dict().items()}
    state.update({f"target.{k}": v.clone() for k, v in update.target.state_dict().items()})
    if isinstance(update, SACLearnerUpdate):
        state["log_alpha"] = update.log_alpha.detach().clone()
    return state


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in before if not torch.equal(before[k], after[k])}


LEARNER_CASES = {
    "ddpg": ("apex_ddpg", {}),
    "td3": ("apex_ddpg", {"twin": True, "target_noise": 0.2, "policy_delay": 2}),
    "sac": ("sac", {}),
}


@pytest.mark.parametrize("case", list(LEARNER_CASES))
def test_learner_updates_sends_priorities_and_publishes(case, monkeypatch, tmp_path):
    algo, ddpg = LEARNER_CASES[case]
    learner = bare_learner(config(algo, ddpg=ddpg), monkeypatch)
    model = learner.online
    assert isinstance(model, SACModel if algo == "sac" else DDPGModel)
    before = snapshot(learner)
    rng = np.random.default_rng(0)
    for i in range(6):
        feed(learner, batch(rng, 100 * i))
    assert dropped(learner) == []
    assert learner.updates == 6 and np.isfinite(learner.last_loss)
    assert learner.published == 2  # every publish_interval = 3 updates
    sent = learner.priority_pub.sent  # type: ignore[attr-defined]
    assert len(sent) == 6
    for i, (msg, topic) in enumerate(sent):
        assert topic == P.priority_topic("replay-0")
        np.testing.assert_array_equal(msg.arrays["key"], np.arange(100 * i, 100 * i + B))
        p = msg.arrays["priority"]
        assert p.dtype == np.float32 and np.all(np.isfinite(p)) and np.all(p >= 0)
    moved = changed(before, snapshot(learner))
    assert any(k.startswith("online.q1.") for k in moved)
    assert any(k.startswith("online.policy.") for k in moved)
    assert any(k.startswith("target.q1.") for k in moved)  # Polyak-averaged towards online
    # SAC has no target policy; DDPG's follows the online one.
    assert any(k.startswith("target.policy.") for k in moved) == (algo == "apex_ddpg")
    assert ("log_alpha" in moved) == (algo == "sac")
    # The bounds travel with the weights, unchanged.
    assert not any("action_" in k for k in moved)
    info = learner.heartbeat_info()
    assert info["updates"] == 6 and "actor_loss" in info

    # A checkpoint restores exactly.
    learner.checkpoint = tmp_path / "learner-0.pt"
    learner.save_checkpoint()
    other = bare_learner(config(algo, ddpg=ddpg), monkeypatch)
    other.checkpoint = learner.checkpoint
    other.load_checkpoint()
    assert other.updates == 6 and other.weights_version == 3
    assert not changed(snapshot(learner), snapshot(other))


@pytest.mark.parametrize(
    "change",
    [
        {"action": np.full((B, 1), 2.5, np.float32)},  # outside [-2, 2]
        {"action": np.zeros((B, 2), np.float32)},  # too wide
        {"action": np.zeros(B, np.int64)},  # DQN actions
        {"obs": np.full((B, 3), np.nan, np.float32)},
        {"next_obs": np.full((B, 3), np.inf, np.float32)},
        {"reward": np.full(B, np.nan, np.float32)},
        {"obs": np.zeros((B, 5), np.float32)},
    ],
)
def test_learner_drops_batches_that_are_not_finite_or_out_of_bounds(change, monkeypatch):
    learner = bare_learner(config("apex_ddpg"), monkeypatch)
    before = snapshot(learner)
    bad = batch(np.random.default_rng(1), **change)
    with pytest.raises(P.ProtocolError):
        learner.update.receive(bad, learner.weights_version)
    feed(learner, bad)  # the learner drops it (counted), trains on nothing
    assert [sender for sender, _ in dropped(learner)] == ["replay-0"]
    assert learner.updates == 0 and not changed(before, snapshot(learner))
    assert learner.priority_pub.sent == []  # type: ignore[union-attr]


@pytest.mark.parametrize("algo", ["apex_ddpg", "sac"])
def test_learner_stops_on_repeated_non_finite_losses_without_changing_weights(algo, monkeypatch):
    learner = bare_learner(config(algo, ddpg={"twin": True}), monkeypatch)
    rng = np.random.default_rng(2)
    # Finite inputs whose squared TD error overflows float32: the loss is inf.
    huge = {"reward": np.full(B, 1e38, np.float32)}
    for n in range(1, 6):
        feed(learner, batch(rng, **huge))  # dropped, counted
        assert len(dropped(learner)) == n and learner.updates == 0
        assert re.search("non-finite|NonFinite|nan|inf", dropped(learner)[-1][1])
    feed(learner, batch(rng))  # a good batch in between resets the count
    assert learner.updates == 1 and learner.non_finite_in_a_row == 0
    before = snapshot(learner)
    for _ in range(9):
        feed(learner, batch(rng, **huge))
    assert len(dropped(learner)) == 14
    with pytest.raises(RoleError, match=r"learner-0: .* at update 2 .*replay-0.*stopping"):
        feed(learner, batch(rng, **huge))
    assert learner.diverged and learner.updates == 1
    assert not changed(before, snapshot(learner))
    assert learner.priority_pub.sent and len(learner.priority_pub.sent) == 1  # type: ignore[attr-defined]


# --- config, models, evaluation -----------------------------------------------------------


def test_config_sections_and_validation():
    cfg = config("apex_ddpg")
    assert (
        cfg.section(DDPGConfig).policy_delay == 1
        and cfg.section(DDPGConfig).twin is False
        and cfg.section(SACConfig).target_entropy is None
    )
    base = cfg.model_dump(mode="json")
    with pytest.raises(ConfigError, match="roles.replay"):
        config_from_dict(base, ["roles.replay=0"])
    with pytest.raises(ConfigError, match="uniform or prioritized"):
        config_from_dict(base, ["replay.table=fifo"])
    with pytest.raises(ConfigError, match="ddpg.policy_delay"):
        config_from_dict(base, ["ddpg.policy_delay=0"])
    with pytest.raises(ConfigError, match="unknown key"):
        config_from_dict(base, ["sac.temperature=1"])
    assert config_from_dict(base, ["algo=sac", "replay.table=uniform"]).algo == "sac"
    # One actor and one learner for every algorithm; the algorithm supplies their parts.
    assert role_class("actor") is Actor
    assert role_class("learner") is Learner
    kinds = {"sac": (SACPolicy, SACLearnerUpdate), "apex_ddpg": (ApexDDPGPolicy, ApexDDPGUpdate)}
    for algo, (policy, update) in kinds.items():
        algorithm = get_algorithm(algo)
        assert algorithm.policy is policy
        assert algorithm.update is update


def test_greedy_evaluation_plays_box_actions():
    cfg = config("apex_ddpg", ddpg={"twin": True})
    probe = make_vector_env(cfg.env, 1)
    model = build_model(
        probe.single_observation_space, probe.single_action_space, cfg.model, cfg.algo, twin=True
    )
    probe.close()
    returns = greedy_returns(model, lambda n: make_vector_env(cfg.env, n), 2, seed=0)
    assert returns.shape == (2,) and np.all(np.isfinite(returns)) and np.all(returns < 0)


# --- a real actor in-process ----------------------------------------------------------------


def test_generic_actor_becomes_continuous_and_sends_trajectories(inproc):
    inproc.start_broker(config("sac", roles={"actors": 1}))
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)  # what `zrl start actor` builds
    assert isinstance(actor, Actor) and isinstance(actor.policy, ContinuousPolicy)
    deadline = time.monotonic() + 15
    got = None
    while got is None and time.monotonic() < deadline:
        got = experience.recv()
    assert got is not None
    msg = got[1]
    assert msg.kind == P.TRAJECTORY and msg.sender == "actor-0"
    assert msg.arrays["action"].shape == (E, T, 1)
    items, _ = assemble_transitions(msg, 3, 0.9, continuous=True)
    assert np.all(items["action"] >= LOW) and np.all(items["action"] <= HIGH)
    assert inproc.error_of(actor) is None
