"""Recurrent PPO (``model.core: lstm``): the actor policy's state and resets, the learner's
replay of the recorded state, its refusals, its minibatch loss, and a real run.

The reset convention under test: ``episodes_started`` marks envs whose next observation starts
an episode; the policy zeroes their state before acting on it and records ``first`` True at
that step. A mark pending at the end of a trajectory is applied by the next ``begin`` (so the
rollout's ``state`` is already zero there) and still shows in that rollout's ``first[:, 0]``.
The learner's bootstrap state is zeroed where the last step only reset the env."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.recurrent import ACT_SPACE, CORE, OBS_SPACE, E, ScriptedActor, T, step_by_step
from zrl.algos.api.learner import UpdateResult
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.models import build_model
from zrl.algos.ppo.config import PPOConfig
from zrl.algos.ppo.policy import PPOPolicy, RecurrentPPOPolicy, make_policy
from zrl.algos.ppo.rounds import recurrent_round_tensors
from zrl.algos.ppo.update import PPOUpdate
from zrl.algos.registry import get_algorithm
from zrl.config.experiment import ExperimentConfig
from zrl.nets.recurrent import RecurrentActorCritic
from zrl.nets.wire import model_to_arrays
from zrl.roles.actor import Actor
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import actor_setup, cue_recall, learner_setup
from zrl.testing.inproc import InProc, collect
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.messages import RECURRENT_UNROLL
from zrl.transport.schema import validate

torch.set_num_threads(1)


def make_config(**changes: Any) -> ExperimentConfig:
    spec: dict[str, Any] = {
        "algo": "ppo",
        "seed": 3,
        "roles": {"actors": 2, "learners": 1, "replay": 0, "params": 1, "evaluator": 0},
        "env": {"id": "zrl/CartPoleNoVel-v1", "num_envs": E},
        "model": {"hidden": [16], "core": "lstm", "core_size": CORE},
        "actor": {"trajectory_length": T},
        "ppo": {"epochs": 3, "minibatch_size": 2 * T},  # two env rows per minibatch
    }
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        spec.setdefault(section, {})[key] = value
    return ExperimentConfig.model_validate(spec)


def make_model(cfg: ExperimentConfig, seed: int = 0) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    model = build_model(OBS_SPACE, ACT_SPACE, cfg.model, "ppo")
    assert isinstance(model, RecurrentActorCritic)
    return model


def make_policy_for(cfg: ExperimentConfig, model: torch.nn.Module) -> RecurrentPPOPolicy:
    policy = make_policy(actor_setup(cfg, model, OBS_SPACE, ACT_SPACE, cfg.env.num_envs, seed=1))
    assert isinstance(policy, RecurrentPPOPolicy)
    return policy


class FakeServices:
    """A single learner's services: it must open no sockets and follow no weights."""

    def __init__(self) -> None:
        self.id = "learner-test"
        self.stop_event = threading.Event()

    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Any:
        raise AssertionError(f"a single learner opened a publisher {name!r}")

    def open_subscriber(self, topics: list[str], name: str, *, hwm: int = 1000) -> Any:
        raise AssertionError(f"a single learner opened a subscriber {name!r}")

    def tick(self) -> None:
        pass

    def follow_weights(self, model: Any) -> Any:
        raise AssertionError("the leader follows no weights")


def make_update(cfg: ExperimentConfig, model: torch.nn.Module) -> PPOUpdate:
    return PPOUpdate(learner_setup(cfg, model, OBS_SPACE, ACT_SPACE, services=FakeServices()))


# ----------------------------------------------------------------------------- a scripted actor


# ----------------------------------------------------------------------------- actor policy


def test_feed_forward_ppo_keeps_the_plain_policy():
    cfg = make_config(model__core="none")
    model = build_model(OBS_SPACE, ACT_SPACE, cfg.model, "ppo")
    policy = make_policy(actor_setup(cfg, model, OBS_SPACE, ACT_SPACE, E, seed=1))
    assert type(policy) is PPOPolicy


def test_policy_zeroes_the_state_exactly_of_the_envs_that_start_episodes():
    cfg = make_config()
    model = make_model(cfg)
    policy = make_policy_for(cfg, model)
    rng = np.random.default_rng(0)
    obs = [rng.normal(size=(E, 2)).astype(np.float32) for _ in range(4)]
    policy.begin(4, 0)
    np.testing.assert_array_equal(policy.start_state, np.zeros((E, 2 * CORE), np.float32))
    _, x0 = policy.act(obs[0], 0)
    assert x0["first"].tolist() == [True] * E  # the actor's first observations start episodes
    _, x1 = policy.act(obs[1], 1)
    assert x1["first"].tolist() == [False] * E
    before = policy.state.copy()
    assert np.abs(before).min(axis=1).max() > 0  # every env carries a state now
    policy.episodes_started(np.array([1]))
    _, x2 = policy.act(obs[2], 2)
    assert x2["first"].tolist() == [False, True, False]
    # Env 1 acted from zeros, the others from their carried states.
    expected = before.copy()
    expected[1] = 0.0
    with torch.no_grad():
        _, _, after = model.step(torch.from_numpy(obs[2]), torch.from_numpy(expected))
    np.testing.assert_allclose(policy.state, after.numpy(), atol=1e-6)
    # A mark after the last step: the next begin zeroes that env in the recorded state, and
    # the first act still reports it.
    policy.episodes_started(np.array([2]))
    carried = policy.state.copy()
    policy.begin(4, 0)
    expected = carried.copy()
    expected[2] = 0.0
    np.testing.assert_array_equal(policy.start_state, expected)
    _, x0 = policy.act(obs[3], 0)
    assert x0["first"].tolist() == [False, False, True]


def test_policy_sends_a_recurrent_unroll_with_its_state_and_resets():
    cfg = make_config()
    model = make_model(cfg)
    actor = ScriptedActor(make_policy_for(cfg, model))
    # Env 0 ends an episode at t=2 (t=3 resets it; t=4 starts the next); env 2 at t=6.
    first = actor.collect({0: [2], 2: [6]})
    sizes = validate(first, RECURRENT_UNROLL, O=(2,), R=2 * CORE)
    assert (sizes["E"], sizes["T"], sizes["R"]) == (E, T, 2 * CORE)
    a = first.arrays
    np.testing.assert_array_equal(a["state"], 0.0)
    expected_first = np.zeros((E, T), bool)
    expected_first[:, 0] = True
    expected_first[0, 4] = True
    np.testing.assert_array_equal(a["first"], expected_first)
    # Env 2's episode ends at t=6, so t=7 resets it: its next observation starts an episode.
    second = actor.collect({})
    b = second.arrays
    assert b["first"][:, 0].tolist() == [False, False, True]
    assert not b["first"][:, 1:].any()
    np.testing.assert_array_equal(b["state"][2], 0.0)
    assert np.abs(b["state"][:2]).min() > 0
    # The recorded logp is what the stored state reproduces, step by step.
    for arrays in (a, b):
        logp, _, _ = step_by_step(model, arrays)
        np.testing.assert_allclose(arrays["logp"], logp, atol=1e-6)


def test_recurrent_ppo_refuses_env_groups_and_uneven_dd_ppo_rows():
    algo = get_algorithm("ppo")
    algo.check(make_config())
    with pytest.raises(ValueError, match="actor.env_groups: 3"):
        algo.check(make_config(actor__env_groups=3))
    # 2 rows per minibatch split across 2 learners: fine; 3 rows across 2: refused.
    algo.check(make_config(roles__learners=2))
    with pytest.raises(ValueError, match=r"ppo.minibatch_size 24 // actor.trajectory_length 8"):
        algo.check(make_config(roles__learners=2, ppo__minibatch_size=3 * T))


# ----------------------------------------------------------------------------- learner replay


def test_learner_values_replay_what_the_actor_computed_across_episode_starts():
    cfg = make_config()
    model = make_model(cfg)
    actor = ScriptedActor(make_policy_for(cfg, model))
    up = make_update(cfg, model)
    msgs = [actor.collect({0: [2], 2: [6]}), actor.collect({1: [0, 5]}), actor.collect({})]
    rollouts = [up.validate(m) for m in msgs]
    assert [r.arrays["first"][:, 0].tolist() for r in rollouts[1:]] == [
        [False, False, True],  # env 2's step 7 reset it
        [False, False, False],  # env 1's step 6 reset it; step 7 started its episode
    ]
    for i, r in enumerate(rollouts[:2]):
        data = recurrent_round_tensors(
            model, [r], cfg.section(PPOConfig).gamma, cfg.section(PPOConfig).gae_lambda
        )
        logp, values, final = step_by_step(model, r.arrays)
        np.testing.assert_allclose(data["value"].numpy(), values, atol=1e-6)
        np.testing.assert_allclose(r.arrays["logp"], logp, atol=1e-6)
        # The bootstrap value: the actor's value at the next rollout's first step, from the
        # state it recorded there (its pending resets applied).
        nxt = rollouts[i + 1].arrays
        np.testing.assert_array_equal(nxt["obs"][:, 0], r.arrays["bootstrap_obs"])
        np.testing.assert_allclose(
            nxt["state"], final.masked_fill(torch.from_numpy(nxt["first"][:, :1]), 0.0), atol=1e-6
        )
        _, boot = step_by_step(model, nxt)[:2]
        adv, ret = rollout_gae(
            r.arrays["reward"],
            values,
            r.arrays["terminated"],
            r.arrays["truncated"],
            r.arrays["valid"],
            boot[:, 0],
            cfg.section(PPOConfig).gamma,
            cfg.section(PPOConfig).gae_lambda,
        )
        np.testing.assert_allclose(data["advantage"].numpy(), adv, atol=1e-5)
        np.testing.assert_allclose(data["return"].numpy(), ret, atol=1e-5)
        for k in ("state", "first", "valid", "action", "logp"):
            np.testing.assert_array_equal(data[k].numpy(), r.arrays[k])


# ----------------------------------------------------------------------------- the actor role


def test_actor_role_records_resets_the_learner_replays(inproc: InProc):
    """The real actor on CartPoleNoVel (episodes end inside its rollouts): ``first`` marks the
    step after each reset-only step, rollouts continue each other's states, and unrolling
    from the recorded state reproduces the behaviour log-probs."""
    rollouts_kept = 4
    cfg = make_config(
        roles__actors=1,
        roles__evaluator=0,
        env__num_envs=4,
        actor__trajectory_length=16,
        ppo__mode="async",
        ppo__max_lag=rollouts_kept - 1,
        broker__heartbeat_interval=0.2,
        broker__heartbeat_timeout=5.0,
    )
    inproc.start_broker(cfg)
    sub = inproc.sub(P.ROLLOUTS_TOPIC)
    inproc.start(ParameterServer, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(actor.policy, RecurrentPPOPolicy)
    pub = inproc.pub("params-0")
    inproc.wait_subscribed(sub)
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=pub)
    model = make_model(cfg, seed=5)
    with torch.no_grad():
        model.policy_head.weight.mul_(50.0)  # a policy sharp enough to differ from uniform
    weights = model_to_arrays(model)

    def adopted() -> bool:
        if actor.weights.version >= 1:
            return True
        pub.send(P.Message(P.WEIGHTS, meta={"version": 1}, arrays=weights), topic=P.WEIGHTS_TOPIC)
        return False

    wait_for(adopted, timeout=10, interval=0.1)
    got = collect(sub, until=rollouts_kept, timeout=15)
    assert len(got) == rollouts_kept and inproc.error_of(actor) is None
    arrays = [{k: np.array(v) for k, v in m.arrays.items()} for m in got]
    assert all(validate(m, RECURRENT_UNROLL, O=(2,), R=2 * CORE) for m in got)
    assert arrays[0]["first"][:, 0].all()
    assert any((~a["valid"]).any() for a in arrays)  # episodes did end inside the rollouts
    previous_final: torch.Tensor | None = None
    for i, a in enumerate(arrays):
        # An episode starts at the step after a reset-only step, the next rollout's first
        # step included.
        np.testing.assert_array_equal(a["first"][:, 1:], ~a["valid"][:, :-1])
        if i > 0:
            np.testing.assert_array_equal(a["first"][:, 0], ~arrays[i - 1]["valid"][:, -1])
            np.testing.assert_array_equal(a["obs"][:, 0], arrays[i - 1]["bootstrap_obs"])
        first = torch.from_numpy(a["first"])
        if previous_final is not None:
            np.testing.assert_allclose(
                a["state"], previous_final.masked_fill(first[:, :1], 0.0).numpy(), atol=1e-6
            )
        with torch.no_grad():
            logits, _, previous_final = model.unroll(
                torch.from_numpy(a["obs"]), torch.from_numpy(a["state"]), first
            )
        logp = torch.log_softmax(logits, -1).gather(2, torch.from_numpy(a["action"])[..., None])
        np.testing.assert_allclose(a["logp"], logp[..., 0].numpy(), atol=1e-5)


# ----------------------------------------------------------------------------- refusals


def recurrent_msg(**changes: Any) -> P.Message:
    cfg = make_config()
    msg = ScriptedActor(make_policy_for(cfg, make_model(cfg))).collect({0: [2]})
    for name, value in changes.items():
        if value is None:
            del msg.arrays[name]
        else:
            msg.arrays[name] = value
    return msg


MALFORMED = {
    "wrong state width": lambda: recurrent_msg(state=np.zeros((E, CORE), np.float32)),
    "state of other envs": lambda: recurrent_msg(state=np.zeros((E + 1, 2 * CORE), np.float32)),
    "missing first": lambda: recurrent_msg(first=None),
    "missing state": lambda: recurrent_msg(state=None),
    "first not bool": lambda: recurrent_msg(first=np.zeros((E, T), np.float32)),
    "first too short": lambda: recurrent_msg(first=np.zeros((E, T - 1), bool)),
    "non-finite state": lambda: recurrent_msg(state=np.full((E, 2 * CORE), np.nan, np.float32)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_recurrent_rollouts_raise_protocol_error(case: str):
    cfg = make_config()
    up = make_update(cfg, make_model(cfg))
    with pytest.raises(P.ProtocolError):
        up.receive(MALFORMED[case](), 1)
    assert not up.buffer.pending


def test_learners_refuse_the_other_kind_of_unroll():
    cfg, ff_cfg = make_config(), make_config(model__core="none")
    ff = make_update(ff_cfg, build_model(OBS_SPACE, ACT_SPACE, ff_cfg.model, "ppo"))
    with pytest.raises(P.ProtocolError, match="unexpected array"):
        ff.receive(recurrent_msg(), 1)
    recurrent = make_update(cfg, make_model(cfg))
    with pytest.raises(P.ProtocolError, match="lacks array"):
        recurrent.receive(recurrent_msg(state=None, first=None), 1)


# ----------------------------------------------------------------------------- training


def test_trains_a_recurrent_round_of_whole_env_rows():
    cfg = make_config()
    model = make_model(cfg)
    up = make_update(cfg, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for actor in (0, 1):
        msg = ScriptedActor(make_policy_for(cfg, make_model(cfg)), seed=actor).collect({0: [2]})
        msg.meta["actor"] = actor
        up.receive(msg, 1)
    result = up.train(1)
    assert isinstance(result, UpdateResult) and result.publish
    rows_per_epoch = 2 * E // 2  # round rows (2 actors x E envs) // rows per minibatch
    assert result.updates == cfg.section(PPOConfig).epochs * rows_per_epoch
    assert math.isfinite(result.loss)
    assert result.samples == 2 * (E * T - 1)  # env 0's reset step is not a sample
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {"approx_kl", "clip_fraction", "entropy"} <= set(up.heartbeat_info())


def test_dd_ppo_row_shares_average_to_the_whole_minibatch_gradient():
    cfg = make_config()
    model = make_model(cfg)
    up = make_update(cfg, model)
    actors = [ScriptedActor(make_policy_for(cfg, model), seed=seed) for seed in (0, 1)]
    msgs = [actor.collect({0: [2], 1: [5]}) for actor in actors]
    data = recurrent_round_tensors(model, [up.validate(m) for m in msgs], 0.98, 0.8)
    mb = {k: v[:4] for k, v in data.items()}  # 4 rows, unequal valid steps per half

    def gradient(learners: int, index: int) -> list[torch.Tensor]:
        up.learners, up.learner_index = learners, index
        model.zero_grad()
        loss, _ = up.sequence_loss(mb)
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole = gradient(1, 0)
    halves = [gradient(2, 0), gradient(2, 1)]
    for g, g0, g1 in zip(whole, *halves, strict=True):
        torch.testing.assert_close((g0 + g1) / 2, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("memory", [True, False])
def test_recurrent_ppo_learns_a_task_that_needs_memory(memory: bool):
    """A cue seen only at the first step decides which action the last step is rewarded for:
    carrying the state, the policy learns to remember it; with the state zeroed before every
    step (``episodes_started`` each step: a feed-forward policy) it stays at chance."""
    steps, envs = 4, 32
    cfg = make_config(
        env__num_envs=envs,
        actor__trajectory_length=steps,
        roles__actors=1,
        ppo__minibatch_size=envs * steps // 2,
        ppo__epochs=4,
        learner__lr=0.01,
    )
    model = make_model(cfg)
    policy = make_policy_for(cfg, model)  # acts with the learner's model: sync mode's weights
    up = make_update(cfg, model)
    rng = np.random.default_rng(0)

    def episode(version: int) -> tuple[P.Message, float]:
        trajectory, hit = cue_recall(policy, rng, envs, steps, memory)
        out = policy.finish(trajectory)
        meta = {"weights_version": version, "actor": 0, "env_steps": envs * steps}
        return P.Message(out.kind, meta=meta, arrays=out.arrays), hit

    success = []
    for version in range(1, 21):
        msg, hit = episode(version)
        success.append(hit)
        up.receive(msg, version)
        assert up.train(version) is not None
    assert np.mean(success[:3]) < 0.75, success  # chance before training
    if memory:
        assert np.mean(success[-5:]) > 0.9, success
    else:
        assert np.mean(success[-5:]) < 0.75, success


# ----------------------------------------------------------------------------- a real run
