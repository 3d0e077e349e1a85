"""Recurrent IMPALA and APPO (``model.core`` with impala or appo): ``unroll_outputs`` against the
actor's step-by-step computation (episode starts inside the unroll, a reset-only last step),
the FIFO shard storing each unroll's state and resets and refusing the other kind, the
learners' refusals, one update of each, and a task that needs memory.

The reset convention is recurrent PPO's (``tests/algos/test_recurrent_ppo.py``; its scripted
actor, ``tests/helpers/recurrent.py``, drives the policy here): ``first[e, t]`` marks where the
actor zeroed the state, and the bootstrap state is zeroed where the last step only reset the
env."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.helpers.frames import SHAPE as FRAME_SHAPE
from tests.helpers.frames import Collector, act_on, scripted_actions
from tests.helpers.recurrent import ACT_SPACE, CORE, OBS_SPACE, ScriptedActor, step_by_step
from tests.helpers.recurrent import E as ENVS
from tests.helpers.recurrent import T as STEPS
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.impala.losses import impala_update
from zrl.algos.impala.update import ImpalaUpdate
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.sampling import (
    CategoricalPolicy,
    RecurrentCategoricalPolicy,
    make_categorical_policy,
)
from zrl.algos.kernel.unrolls import RECURRENT_TRAINED_ARRAYS, UnrollUpdate, unroll_outputs
from zrl.algos.models import build_model
from zrl.algos.ppo.policy import RecurrentPPOPolicy
from zrl.algos.registry import get_algorithm
from zrl.config.experiment import ExperimentConfig
from zrl.nets.recurrent import RecurrentActorCritic
from zrl.replay.assemble import assemble_items, assemble_unrolls
from zrl.replay.layout import ExperienceLayout, experience_layout
from zrl.replay.tables import make_table
from zrl.roles.replay import ReplayServer
from zrl.testing.fakes import actor_setup, as_message, cue_recall, learner_setup
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate

torch.set_num_threads(1)
R = 2 * CORE  # an LSTM's state: h and c


def make_config(algo: str = "impala", **changes: Any) -> ExperimentConfig:
    spec: dict[str, Any] = {
        "algo": algo,
        "seed": 3,
        "roles": {"actors": 1, "replay": 1, "learners": 1},
        "env": {"id": "zrl/CartPoleNoVel-v1", "num_envs": ENVS},
        "model": {"hidden": [16], "core": "lstm", "core_size": CORE},
        "actor": {"trajectory_length": STEPS},
        "replay": {"table": "fifo", "batch_size": 2 * ENVS},
    }
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        spec.setdefault(section, {})[key] = value
    return ExperimentConfig.model_validate(spec)


def make_model(cfg: ExperimentConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(OBS_SPACE, ACT_SPACE, cfg.model, cfg.algo)


def make_policy(cfg: ExperimentConfig, model: torch.nn.Module) -> Any:
    return make_categorical_policy(
        actor_setup(cfg, model, OBS_SPACE, ACT_SPACE, cfg.env.num_envs, seed=1)
    )


def make_update(cfg: ExperimentConfig, model: torch.nn.Module) -> UnrollUpdate:
    setup = learner_setup(cfg, model, OBS_SPACE, ACT_SPACE)
    return ImpalaUpdate(setup) if cfg.algo == "impala" else AppoUpdate(setup)


def shard_batch(msgs: list[P.Message], recurrent: bool = True) -> P.Message:
    """What a FIFO shard sends after storing ``msgs``: all their unrolls, oldest first."""
    table = make_table("fifo", 256)
    for msg in msgs:
        table.insert(assemble_unrolls(msg, M.RECURRENT_UNROLL if recurrent else M.UNROLL))
    shard = SimpleNamespace(
        config=SimpleNamespace(replay=SimpleNamespace(batch_size=table.size)),
        table=table,
        limiter=SimpleNamespace(on_sample=lambda n: None),
        rng=np.random.default_rng(0),
        id="replay-0",
    )
    sent = ReplayServer.sample_batch(shard)  # type: ignore[arg-type]
    return P.decode([bytes(memoryview(f)) for f in P.encode(sent)])  # as a learner gets it


def tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- unroll_outputs


def stepwise_outputs(
    model: RecurrentActorCritic, b: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The definition: ``model.step`` one step at a time, the state zeroed before each step
    ``first`` marks, then one step on ``bootstrap_obs`` from the final state, zeroed where the
    last step only reset the env."""
    state = b["state"]
    logits, values = [], []
    for t in range(b["obs"].shape[1]):
        state = torch.where(b["first"][:, t, None], torch.zeros_like(state), state)
        lg, v, state = model.step(b["obs"][:, t], state)
        logits.append(lg)
        values.append(v)
    state = torch.where(b["valid"][:, -1:], state, torch.zeros_like(state))
    _, bootstrap, _ = model.step(b["bootstrap_obs"], state)
    return torch.stack(logits, 1), torch.stack(values, 1), bootstrap


def hand_batch(state_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """B=3 unrolls of T=6. Env 0 terminates at t=1: t=2 only resets it, an episode starts at
    t=3. Env 1 terminates at t=4: its last step only resets it (the bootstrap state is zero).
    Env 2 starts an episode at t=0 (from a zero state). Envs 0 and 1 carry a state."""
    gen = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    first = torch.zeros(B, T, dtype=torch.bool)
    valid = torch.ones(B, T, dtype=torch.bool)
    terminated = torch.zeros(B, T, dtype=torch.bool)
    terminated[0, 1], valid[0, 2], first[0, 3] = True, False, True
    terminated[1, 4], valid[1, 5] = True, False
    first[2, 0] = True
    state = torch.randn(B, state_size, generator=gen)
    state[2] = 0.0
    return {
        "obs": torch.randn(B, T, 2, generator=gen),
        "state": state,
        "first": first,
        "valid": valid,
        "terminated": terminated,
        "bootstrap_obs": torch.randn(B, 2, generator=gen),
    }


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_unroll_outputs_are_the_actors_steps_with_its_resets(core: str):
    model = make_model(make_config(model__core=core), seed=1)
    assert isinstance(model, RecurrentActorCritic)
    b = hand_batch(model.state_size)
    with torch.no_grad():
        got = unroll_outputs(model, b)
        want = stepwise_outputs(model, b)
        # Without the resets (or the bootstrap zeroing) the outputs would differ: the test
        # sees them.
        no_resets = {
            **b,
            "first": torch.zeros_like(b["first"]),
            "valid": torch.ones_like(b["valid"]),
        }
        _, unreset_values, unreset_boot = unroll_outputs(model, no_resets)
    assert got[0].shape == (3, 6, 2) and got[1].shape == (3, 6) and got[2].shape == (3,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    assert (got[1][0, 3:] - unreset_values[0, 3:]).abs().min() > 1e-6
    assert (got[2][1] - unreset_boot[1]).abs() > 1e-6


def test_unroll_outputs_of_a_feed_forward_model_are_one_forward_pass():
    model = make_model(make_config(model__core="none"))
    b = hand_batch(1)
    with torch.no_grad():
        logits, values, bootstrap = unroll_outputs(model, b)
        want_logits, want_values = model(b["obs"].flatten(0, 1))
        _, want_boot = model(b["bootstrap_obs"])
    torch.testing.assert_close(logits, want_logits.reshape(3, 6, -1))
    torch.testing.assert_close(values, want_values.reshape(3, 6))
    torch.testing.assert_close(bootstrap, want_boot)


# ------------------------------------------------------------------------ actor -> shard -> learner


def test_the_learner_replays_what_the_actor_computed_through_the_fifo():
    """A scripted actor's unrolls (an episode start inside, a reset-only last step) through a
    FIFO shard: the learner's log-probs are the actor's, its bootstrap value is the actor's
    value at the next unroll's first step, and an update at lag 0 is on-policy (rho 1)."""
    cfg = make_config()
    model = make_model(cfg)
    policy = make_policy(cfg, model)
    assert type(policy) is RecurrentCategoricalPolicy
    actor = ScriptedActor(policy)
    # Env 0 ends an episode at t=2 (t=3 resets it); env 2 at t=6 (its last step resets it).
    msgs = [actor.collect({0: [2], 2: [STEPS - 2]}), actor.collect({1: [1]})]
    for msg in msgs:
        assert msg.kind == P.TRAJECTORY
        validate(msg, M.RECURRENT_UNROLL, O=(2,), R=R)
    batch = shard_batch(msgs)
    sizes = validate(batch, M.RECURRENT_UNROLL_BATCH, O=(2,), R=R)
    assert sizes["B"] == 2 * ENVS
    a = batch.arrays
    for i, msg in enumerate(msgs):  # oldest first: each message's envs in order
        rows = slice(i * ENVS, (i + 1) * ENVS)
        for name in ("state", "first", "obs", "logp", "valid"):
            np.testing.assert_array_equal(a[name][rows], msg.arrays[name])
    assert not a["valid"][ENVS - 1, -1] and a["first"][2 * ENVS - 1, 0]

    b = tensors({k: a[k] for k in RECURRENT_TRAINED_ARRAYS})
    with torch.no_grad():
        logits, _, bootstrap = unroll_outputs(model, b)
    logp = torch.log_softmax(logits, -1).gather(-1, b["action"][..., None])[..., 0]
    np.testing.assert_allclose(logp.numpy(), a["logp"], atol=1e-6)
    # The first unroll's bootstrap value is the value the actor had at the second's step 0.
    _, next_values, _ = step_by_step(model, msgs[1].arrays)
    np.testing.assert_allclose(bootstrap[:ENVS].numpy(), next_values[:, 0], atol=1e-6)

    result = impala_update(
        model,
        make_adam(model.parameters(), 1e-3),
        b,
        gamma=0.99,
        rho_bar=1.0,
        c_bar=1.0,
        entropy_coef=0.01,
        value_coef=0.5,
        grad_clip=40.0,
    )
    assert result.mean_rho == pytest.approx(1.0, abs=1e-5)


# ----------------------------------------------------------------------------- the replay shard


def unroll_messages() -> tuple[P.Message, P.Message]:
    """A ``recurrent_unroll`` from a scripted actor, and the same as a plain ``unroll``."""
    cfg = make_config()
    recurrent = ScriptedActor(make_policy(cfg, make_model(cfg))).collect({0: [2]})
    plain = {k: v for k, v in recurrent.arrays.items() if k not in ("state", "first")}
    return recurrent, P.Message(P.TRAJECTORY, meta=recurrent.meta, arrays=plain, sender="actor-0")


def fake_shard(cfg: ExperimentConfig) -> Any:
    """A ``ReplayServer`` reduced to what ``on_trajectory`` touches, over a FIFO table, with
    the layout of the unrolls ``cfg``'s model makes."""
    table = make_table("fifo", 64)
    schema = M.RECURRENT_UNROLL if cfg.model.core != "none" else M.UNROLL
    shard = SimpleNamespace(
        config=cfg,
        layout=ExperienceLayout("unroll", schema, {}, np.dtype(np.float32)),
        table=table,
        _table_for=lambda items: table,
        last_insert=0,
        limiter=SimpleNamespace(on_insert=lambda n: None),
        trajectories=0,
        trajectories_received=0,
        steps_received=0,
        weights_versions=[],
        incarnation=1,
        acks=SimpleNamespace(send=lambda *a, **k: None),
    )
    shard.assemble = lambda msg: ReplayServer.assemble(shard, msg)
    return shard


def test_a_shard_stores_the_kind_of_unroll_its_model_makes_and_refuses_the_other():
    recurrent_cfg, ff_cfg = make_config(), make_config(model__core="none")
    recurrent_msg, plain_msg = unroll_messages()

    shard = fake_shard(recurrent_cfg)
    ReplayServer.on_trajectory(shard, recurrent_msg)  # type: ignore[arg-type]
    assert shard.table.size == ENVS and shard.last_insert == ENVS
    stored = shard.table.sample(ENVS, np.random.default_rng(0)).items
    np.testing.assert_array_equal(stored["state"], recurrent_msg.arrays["state"])
    np.testing.assert_array_equal(stored["first"], recurrent_msg.arrays["first"])
    with pytest.raises(P.ProtocolError, match="lacks array 'state'"):
        ReplayServer.on_trajectory(shard, plain_msg)  # type: ignore[arg-type]

    shard = fake_shard(ff_cfg)
    ReplayServer.on_trajectory(shard, plain_msg)  # type: ignore[arg-type]
    assert set(shard.table.sample(ENVS, np.random.default_rng(0)).items) == {
        *M.UNROLL.arrays,
        "weights_version",
    }
    with pytest.raises(P.ProtocolError, match="unexpected array"):
        ReplayServer.on_trajectory(shard, recurrent_msg)  # type: ignore[arg-type]
    assert shard.table.size == 0  # nothing of the refused message was stored


# ----------------------------------------------------------------------------- the learners


def recurrent_batch(cfg: ExperimentConfig, seed: int = 0) -> P.Message:
    actor = ScriptedActor(make_policy(cfg, make_model(cfg, seed=seed)), seed=seed)
    return shard_batch([actor.collect({0: [2], 1: [STEPS - 2]}), actor.collect({2: [4]})])


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_learners_refuse_the_other_kind_of_batch(algo: str):
    cfg = make_config(algo)
    recurrent = make_update(cfg, make_model(cfg))
    good = recurrent_batch(cfg)
    recurrent.receive(good, 0)
    plain = {k: v for k, v in good.arrays.items() if k not in ("state", "first")}
    with pytest.raises(P.ProtocolError, match="lacks array 'state'"):
        recurrent.receive(P.Message(P.BATCH, meta=good.meta, arrays=plain), 0)
    narrow = {**good.arrays, "state": np.zeros((2 * ENVS, CORE), np.float32)}
    with pytest.raises(P.ProtocolError, match=f"dim R must be {R}, not {CORE}"):
        recurrent.receive(P.Message(P.BATCH, meta=good.meta, arrays=narrow), 0)
    ff_cfg = make_config(algo, model__core="none")
    ff = make_update(ff_cfg, make_model(ff_cfg))
    with pytest.raises(P.ProtocolError, match="unexpected array"):
        ff.receive(good, 0)
    assert len(recurrent.pending) == 1 and not ff.pending


@pytest.mark.parametrize(
    ("algo", "changes"),
    [
        ("impala", {}),
        ("appo", {"appo__epochs": 2, "appo__minibatches": 2, "appo__value_clip": 0.2}),
    ],
)
def test_one_update_on_a_recurrent_batch_trains(algo: str, changes: dict[str, Any]):
    cfg = make_config(algo, **changes)
    model = make_model(cfg)
    update = make_update(cfg, model)
    before = weights_of(model)
    update.receive(recurrent_batch(cfg), 0)
    result = update.train(0)
    assert result is not None and math.isfinite(result.loss)
    assert result.updates == (1 if algo == "impala" else 4)
    assert result.samples == 2 * ENVS * STEPS - 3  # the three reset-only steps are not samples
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    # Gradients reached the core.
    core = {k for k in before if k.startswith("core.")}
    assert core and any(not torch.equal(before[k], model.state_dict()[k]) for k in core)


# ----------------------------------------------------------------------------- config and actor


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_recurrent_impala_and_appo_configs(algo: str):
    algorithm = get_algorithm(algo)
    assert algorithm.recurrent
    algorithm.check(make_config(algo))
    with pytest.raises(ValueError, match=f"actor.random_policy: a recurrent {algo} policy"):
        algorithm.check(make_config(algo, actor__random_policy=True))
    algorithm.check(make_config(algo, actor__random_policy=True, model__core="none"))
    with pytest.raises(ValueError, match="actor.env_groups: 3"):
        algorithm.check(make_config(algo, actor__env_groups=3))
    algorithm.check(make_config(algo, actor__env_groups=3, model__core="none"))


def test_the_policy_follows_the_model():
    ff_cfg = make_config(model__core="none")
    assert type(make_policy(ff_cfg, make_model(ff_cfg))) is CategoricalPolicy
    cfg = make_config()
    assert type(make_policy(cfg, make_model(cfg))) is RecurrentCategoricalPolicy


# ----------------------------------------------------------------------------- memory


MEMORY_TRAINING = {
    "impala": {"impala__epochs": 4},  # one V-trace step per batch learns it too, in ~4x the batches
    "appo": {"appo__epochs": 4, "appo__minibatches": 2},
}


@pytest.mark.parametrize("memory", [True, False])
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_recurrent_learners_learn_a_task_that_needs_memory(algo: str, memory: bool):
    """A cue seen only at the first step decides which action the last step is rewarded for:
    carrying the state, IMPALA and APPO learn to remember it; with the state zeroed before
    every step (a feed-forward policy, in effect) they stay at chance."""
    steps, envs = 4, 32
    cfg = make_config(
        algo,
        env__num_envs=envs,
        actor__trajectory_length=steps,
        replay__batch_size=envs,
        learner__lr=0.01,
        **MEMORY_TRAINING[algo],
    )
    model = make_model(cfg)
    policy = make_policy(cfg, model)  # acts with the learner's weights: lag 0
    update = make_update(cfg, model)
    rng = np.random.default_rng(0)
    success = []
    for version in range(20):
        trajectory, hit = cue_recall(policy, rng, envs, steps, memory)
        arrays = policy.finish(trajectory).arrays
        msg = P.Message(P.TRAJECTORY, meta={"weights_version": version}, arrays=arrays)
        success.append(hit)
        update.receive(shard_batch([msg]), version)
        assert update.train(version) is not None
    assert np.mean(success[:3]) < 0.75, success  # chance before training
    if memory:
        assert np.mean(success[-5:]) > 0.9, success
    else:
        assert np.mean(success[-5:]) < 0.75, success


# ------------------------------------------------------------------ frame stacks: each frame once

FRAME_SPACE = gym.spaces.Box(0, 255, (4, *FRAME_SHAPE), np.uint8)  # stacks of 4 scripted frames
FRAME_ACTIONS = gym.spaces.Discrete(3)


def frame_policy(algo: str, E: int) -> tuple[ExperimentConfig, torch.nn.Module, Any]:
    ppo: dict[str, Any] = {"roles__replay": 0} if algo == "ppo" else {}
    cfg = make_config(algo, model__encoder="mlp", env__num_envs=E, **ppo)
    torch.manual_seed(0)
    model = build_model(FRAME_SPACE, FRAME_ACTIONS, cfg.model, cfg.algo)
    setup = actor_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS, E, seed=1)
    policy = RecurrentPPOPolicy(setup) if algo == "ppo" else make_categorical_policy(setup)
    return cfg, model, policy


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_recurrent_frame_unrolls_through_the_fifo_rebuild_the_actors_stacks(algo: str, monkeypatch):
    """On frame stacks a recurrent policy sends ``recurrent_frame_unroll``s (each frame once,
    with its state and resets) of the layout the shard's spaces fix; the FIFO's
    ``recurrent_frame_unroll_batch`` gives the learner (which refuses full stacks) exactly
    the actor's stacks across episode ends, and it replays the log-probs the actor computed."""
    E, T = 5, STEPS
    cfg, model, policy = frame_policy(algo, E)
    layout = experience_layout(
        "unroll",
        actions="discrete",
        observation_space=FRAME_SPACE,
        action_space=FRAME_ACTIONS,
        num_envs=E,
        trajectory_length=T,
        state_size=R,
    )
    assert layout.schema is M.RECURRENT_FRAME_UNROLL
    collector = Collector(E, 4, seed=5)
    table = make_table("fifo", 64)
    trajectories = []
    for actions in scripted_actions(T, E):
        trajectory = act_on(policy, collector.collect(actions))
        out = policy.finish(trajectory)
        assert set(out.arrays) == set(M.RECURRENT_FRAME_UNROLL.arrays)
        msg = as_message(out.arrays, weights_version=1, actor=0, env_steps=0)
        layout.check(msg)
        table.insert(assemble_items(layout, msg, 1, 0.99)[0])
        trajectories.append(trajectory)
    sampled = table.sample(table.size, np.random.default_rng(0))  # oldest first
    arrays = {**sampled.items, "weight": sampled.weights, "key": sampled.keys.astype(np.int64)}
    batch = P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)
    validate(batch, M.RECURRENT_FRAME_UNROLL_BATCH, O=FRAME_SHAPE, S=T + 4, T=T, R=R)

    setup = learner_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS)
    update = ImpalaUpdate(setup) if algo == "impala" else AppoUpdate(setup)
    assert update.schema is M.RECURRENT_FRAME_UNROLL_BATCH
    obs = np.concatenate([t.obs for t in trajectories])
    final_obs = np.concatenate([t.final_obs for t in trajectories])
    full = {k: v for k, v in arrays.items() if k != "frames"}
    with pytest.raises(P.ProtocolError, match="frames"):
        update.receive(
            P.Message(P.BATCH, arrays={**full, "obs": obs, "bootstrap_obs": final_obs}), 1
        )
    seen: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
    train_unrolls = type(update).train_unrolls

    def spy(self: UnrollUpdate, b: dict[str, torch.Tensor]) -> Any:
        with torch.no_grad():
            logits, _, _ = unroll_outputs(self.model, b)
        seen.append((b, torch.log_softmax(logits, -1).gather(-1, b["action"][..., None])[..., 0]))
        return train_unrolls(self, b)

    monkeypatch.setattr(type(update), "train_unrolls", spy)
    update.receive(batch, 1)
    assert update.train(1) is not None and len(seen) == 1
    trained, logp = seen[0]
    np.testing.assert_array_equal(trained["obs"].numpy(), obs)
    np.testing.assert_array_equal(trained["bootstrap_obs"].numpy(), final_obs)
    np.testing.assert_array_equal(trained["first"].numpy(), arrays["first"])
    np.testing.assert_allclose(logp.numpy(), arrays["logp"], atol=1e-6)


def test_recurrent_ppo_rollouts_keep_the_full_stacks():
    """Recurrent PPO's learners take ``recurrent_unroll`` rollouts: its policy sends the full
    stacks on frame stacks too (``frame_unrolls`` False)."""
    _, _, policy = frame_policy("ppo", 5)
    trajectory = act_on(policy, Collector(5, 4).collect(np.zeros((STEPS, 5), np.int64)))
    out = policy.finish(trajectory)
    validate(as_message(out.arrays), M.RECURRENT_UNROLL, O=FRAME_SPACE.shape, R=R)
    np.testing.assert_array_equal(out.arrays["obs"], trajectory.obs)
