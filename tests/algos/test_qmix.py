"""QMIX: the monotonic mixer, the targets and loss against a loop written from the paper, the
joint actions, the config checks, the actor policy's team transitions, the learner's receipt."""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.api.actor import ActorSetup, Trajectory
from zrl.algos.api.learner import LearnerSetup, NonFiniteLossError
from zrl.algos.api.train_stats import TrainStats
from zrl.algos.qmix.losses import (
    ILLEGAL_Q,
    agent_actions,
    joint_actions,
    linear_epsilon,
    mix,
    qmix_loss,
    qmix_update,
)
from zrl.algos.qmix.model import QMixer, QMIXModel, qmix_model_for, team_size
from zrl.algos.qmix.policy import QMIXPolicy, by_game, team_transitions
from zrl.algos.qmix.update import QMIXUpdate
from zrl.config.experiment import load_config
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.replay.layout import experience_layout
from zrl.transport import protocol as P

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "simple_spread_qmix.yaml"
L, A, FEAT, STATE = 3, 4, 5, 6


def space(mask: bool = False) -> AgentObservationSpace:
    return AgentObservationSpace((FEAT,), A if mask else 0, STATE)


def team_obs(rng: np.random.Generator, B: int, sp: AgentObservationSpace) -> np.ndarray:
    """``[B, L * slot]``: random features, masks with at least one legal action, one state
    per row copied into every agent's slot (as the env does)."""
    slots = rng.normal(size=(B, L, sp.shape[0])).astype(np.float32)
    if sp.mask:
        legal = rng.random((B, L, A)) < 0.6
        legal[..., 0] |= ~legal.any(axis=2)
        slots[..., FEAT : FEAT + A] = legal
    state = rng.normal(size=(B, 1, STATE)).astype(np.float32)
    slots[..., FEAT + sp.mask :] = state
    return slots.reshape(B, -1)


# --- the mixer ------------------------------------------------------------------------------


def reference_mix(q: list[float], w1, b1, w2, b2) -> float:
    """The paper's mixing network for one state, from its hypernetworks' outputs."""
    E = len(b1)
    hidden = []
    for e in range(E):
        x = sum(q[a] * abs(float(w1[a][e])) for a in range(len(q))) + float(b1[e])
        hidden.append(x if x > 0 else math.exp(x) - 1.0)  # ELU
    return sum(hidden[e] * abs(float(w2[e])) for e in range(E)) + float(b2)


def test_mix_matches_reference_loop():
    torch.manual_seed(0)
    B, E = 7, 5
    q, w1 = torch.randn(B, L), torch.randn(B, L, E)
    b1, w2, b2 = torch.randn(B, E), torch.randn(B, E), torch.randn(B)
    out = mix(q, w1, b1, w2, b2)
    for b in range(B):
        want = reference_mix(q[b].tolist(), w1[b].tolist(), b1[b], w2[b], b2[b])
        assert out[b].item() == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_mixer_is_monotonic_in_every_agent_q(seed: int):
    torch.manual_seed(seed)
    mixer = QMixer(STATE, L, embed=8, hypernet=16)
    state = torch.randn(64, STATE) * 3
    w1 = mixer.hyper(state)[0]
    assert (w1 < 0).any()  # the raw hypernetwork outputs have both signs: abs does the work
    q = (torch.randn(64, L) * 5).requires_grad_()
    (grad,) = torch.autograd.grad(mixer(q, state).sum(), q)
    assert (grad >= 0).all(), grad.min()
    # dQ_tot/dQ_a >= 0 also for a state the gradient flows into.
    q2 = torch.randn(64, L, requires_grad=True)
    s2 = torch.randn(64, STATE, requires_grad=True)
    (g2,) = torch.autograd.grad(mixer(q2, s2).sum(), q2)
    assert (g2 >= 0).all()


# --- joint actions and epsilon --------------------------------------------------------------


def test_joint_actions_round_trip_and_digits():
    rng = np.random.default_rng(0)
    actions = rng.integers(0, A, size=(10, 2, L))
    joint = joint_actions(actions, A)
    assert joint.shape == (10, 2) and joint.max() < A**L
    assert joint_actions(np.array([1, 2, 3]), A) == 1 + 2 * A + 3 * A * A
    back = agent_actions(torch.from_numpy(joint.reshape(-1)), L, A).numpy()
    np.testing.assert_array_equal(back, actions.reshape(-1, L))
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        joint_actions(np.array([0, 4]), A)


def test_linear_epsilon():
    assert linear_epsilon(0, 1.0, 0.1, 100) == 1.0
    assert linear_epsilon(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_epsilon(100, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_epsilon(10**6, 1.0, 0.1, 100) == pytest.approx(0.1)


# --- targets and loss against the paper -----------------------------------------------------


def reference_loss(online: QMIXModel, target: QMIXModel, batch, double: bool):
    """The QMIX loss and TD errors with plain loops over the batch: each agent's Q from the
    shared network on its own observation (illegal actions excluded), the bootstrap action by
    the online (double) or target network, the mixing as in the paper."""
    obs, next_obs = batch["obs"].numpy(), batch["next_obs"].numpy()
    sp = online.slot_space
    slot = sp.shape[0]
    tds, losses = [], []
    with torch.no_grad():
        for b in range(obs.shape[0]):
            qs, next_vals = [], []
            joint = int(batch["action"][b])
            for a in range(L):
                o = obs[b, a * slot : (a + 1) * slot]
                no = next_obs[b, a * slot : (a + 1) * slot]
                u = (joint // A**a) % A
                q_row = online.agent(torch.from_numpy(o[:FEAT])[None])[0].tolist()
                qs.append(q_row[u])
                legal = [True] * A if not sp.mask else [no[FEAT + i] > 0.5 for i in range(A)]
                t_row = target.agent(torch.from_numpy(no[:FEAT])[None])[0].tolist()
                if double:
                    o_row = online.agent(torch.from_numpy(no[:FEAT])[None])[0].tolist()
                    best = max((i for i in range(A) if legal[i]), key=lambda i: o_row[i])
                    next_vals.append(t_row[best])
                else:
                    next_vals.append(max(t_row[i] for i in range(A) if legal[i]))
            s = torch.from_numpy(obs[b, FEAT + sp.mask : slot])[None]
            ns = torch.from_numpy(next_obs[b, FEAT + sp.mask : slot])[None]
            h = [x[0] for x in online.mixer.hyper(s)]
            q_tot = reference_mix(qs, h[0].tolist(), h[1], h[2], h[3])
            th = [x[0] for x in target.mixer.hyper(ns)]
            y = float(batch["reward"][b]) + float(batch["discount"][b]) * reference_mix(
                next_vals, th[0].tolist(), th[1], th[2], th[3]
            )
            tds.append(y - q_tot)
            losses.append(float(batch["weight"][b]) * (y - q_tot) ** 2)
    return sum(losses) / len(losses), np.abs(tds)


def make_batch(rng: np.random.Generator, sp: AgentObservationSpace, B: int = 9):
    obs, next_obs = team_obs(rng, B, sp), team_obs(rng, B, sp)
    actions = np.zeros((B, L), np.int64)
    for b in range(B):  # legal actions only, as the actors take
        for a in range(L):
            legal = (
                np.flatnonzero(obs[b, a * sp.shape[0] + FEAT : a * sp.shape[0] + FEAT + A] > 0.5)
                if sp.mask
                else np.arange(A)
            )
            actions[b, a] = rng.choice(legal)
    discount = np.where(rng.random(B) < 0.3, 0.0, 0.9**3).astype(np.float32)
    return {
        "obs": torch.from_numpy(obs),
        "action": torch.from_numpy(joint_actions(actions, A)),
        "reward": torch.from_numpy(rng.normal(size=B).astype(np.float32)),
        "discount": torch.from_numpy(discount),
        "next_obs": torch.from_numpy(next_obs),
        "weight": torch.from_numpy(rng.uniform(0.5, 1.5, B).astype(np.float32)),
    }


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("mask", [False, True])
def test_update_loss_and_td_match_reference_loop(double: bool, mask: bool):
    torch.manual_seed(1)
    sp = space(mask)
    online = QMIXModel(sp, A, L, hidden=(16,), embed=8, hypernet=16)
    target = copy.deepcopy(online)
    for p in target.parameters():  # a target that differs from the online networks
        p.data.add_(0.1 * torch.randn_like(p))
    batch = make_batch(np.random.default_rng(2), sp)
    want_loss, want_td = reference_loss(online, target, batch, double)
    before = copy.deepcopy(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    result = qmix_update(online, target, opt, batch, double=double, grad_clip=10.0)
    assert result.loss == pytest.approx(want_loss, rel=1e-4)
    np.testing.assert_allclose(result.td, want_td, rtol=1e-4, atol=1e-5)
    # The step moved the agent network and the mixer, never the targets.
    after = online.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("agent."))
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("mixer."))


def test_double_and_max_targets_differ():
    torch.manual_seed(3)
    sp = space()
    online = QMIXModel(sp, A, L, hidden=(16,), embed=8, hypernet=16)
    target = QMIXModel(sp, A, L, hidden=(16,), embed=8, hypernet=16)
    batch = make_batch(np.random.default_rng(4), sp)
    a = reference_loss(online, target, batch, True)[0]
    b = reference_loss(online, target, batch, False)[0]
    assert a != pytest.approx(b)


def test_loss_refuses_targets_with_grad_and_update_refuses_bad_input():
    q = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="require grad"):
        qmix_loss(q, q * 2, torch.ones(3))
    online = QMIXModel(space(), A, L)
    batch = make_batch(np.random.default_rng(0), space())
    del batch["weight"]
    with pytest.raises(ValueError, match="missing keys"):
        qmix_update(
            online, online, torch.optim.Adam(online.parameters()), batch, double=True, grad_clip=1.0
        )


def test_non_finite_update_leaves_weights_untouched():
    online = QMIXModel(space(), A, L, hidden=(8,))
    target = copy.deepcopy(online)
    batch = make_batch(np.random.default_rng(0), space())
    batch["reward"][0] = float("inf")
    before = copy.deepcopy(online.state_dict())
    with pytest.raises(NonFiniteLossError):
        qmix_update(
            online, target, torch.optim.Adam(online.parameters()), batch, double=True, grad_clip=1.0
        )
    for k, v in online.state_dict().items():
        assert torch.equal(v, before[k]), k


# --- the model ------------------------------------------------------------------------------


def test_model_masks_illegal_actions_and_reads_only_own_features():
    sp = space(mask=True)
    model = QMIXModel(sp, A, L, hidden=(8,))
    obs = team_obs(np.random.default_rng(0), 4, sp).reshape(4 * L, -1)
    q = model(torch.from_numpy(obs)).detach().numpy()
    legal = obs[:, FEAT : FEAT + A] > 0.5
    assert np.all(q[~legal] == ILLEGAL_Q) and np.all(q[legal] > ILLEGAL_Q)
    changed = obs.copy()
    changed[:, FEAT + A :] += 1.0  # another state: the agent network does not see it
    np.testing.assert_array_equal(model(torch.from_numpy(changed)).detach().numpy(), q)


def test_model_needs_state_and_agent_slots():
    with pytest.raises(ValueError, match="central_value: true"):
        QMIXModel(AgentObservationSpace((FEAT,), 0, 0), A, L)
    cfg = load_config(CONFIG)
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(ValueError, match="slot observations"):
        qmix_model_for(box, gym.spaces.Discrete(2), cfg.model, agents=2)


# --- the config -----------------------------------------------------------------------------


def test_config_loads_and_team_size_probes_the_env():
    cfg = load_config(CONFIG)
    assert cfg.algo == "qmix" and team_size(cfg) == 3
    assert team_size(load_config(CONFIG, ["env.kwargs.N=2"])) == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.id=CartPole-v1"], "env.id: 'CartPole-v1': qmix learns cooperative multi-agent"),
        (["env.multiagent.central_value=false"], "central_value: true"),
        (["env.multiagent.api=aec"], "env.multiagent.api: aec"),
        (["env.multiagent.policy_mapping={agent_1: random}"], "agent_1: random: qmix learns one"),
        (
            ["model.core=gru", "qmix.sequence_length=6", "qmix.burn_in=4"],
            "replay.n_step (3) must be at most qmix.sequence_length - qmix.burn_in (2)",
        ),
        (["model.core=lstm", "model.encoder=nature_cnn"], "model.encoder: nature_cnn: qmix's"),
        (["qmix.sequence_length=5", "qmix.burn_in=5"], "qmix.burn_in (5) must be less than"),
        (["replay.table=prioritized"], "qmix needs replay.table: uniform"),
        (["qmix.epsilon_end=0.5", "qmix.epsilon_start=0.2"], "epsilon_end"),
        (["qmix.mixer_embed=0"], "mixer_embed"),
        (["model.encoder=nature_cnn"], "model.encoder: nature_cnn: qmix's agent network"),
        (["roles.league=1"], "roles.league"),
    ],
)
def test_config_refuses(overrides: list[str], message: str):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(CONFIG, overrides)


def test_turn_based_env_refused_when_the_model_is_built():
    cfg = load_config(CONFIG, ["env.id=pettingzoo/tictactoe_v3", "env.kwargs={}"])
    with pytest.raises(ValueError, match="central_value: this env has no state"):
        team_size(cfg)  # tic-tac-toe has no state() for the mixer
    cfg.env.multiagent.central_value = False  # past that: a turn-based game
    with pytest.raises(ValueError, match="needs a parallel PettingZoo env"):
        team_size(cfg)


# --- the actor policy -----------------------------------------------------------------------


def slot_trajectory(rng: np.random.Generator, G: int, T: int, slot: int) -> Trajectory:
    E = G * L
    done = np.zeros((E, T), bool)
    done[:, 2] = True  # every agent's episode ends at step 2 (they end together)
    valid = np.ones((E, T), bool)
    valid[:, 3] = False
    return Trajectory(
        obs=rng.normal(size=(E, T, slot)).astype(np.float32),
        next_obs=rng.normal(size=(E, T, slot)).astype(np.float32),
        action=rng.integers(0, A, size=(E, T)),
        reward=rng.normal(size=(E, T)).astype(np.float32),
        terminated=done,
        truncated=np.zeros((E, T), bool),
        valid=valid,
        final_obs=rng.normal(size=(E, slot)).astype(np.float32),
    )


def test_team_transitions_group_each_games_slots():
    rng = np.random.default_rng(0)
    G, T, slot = 2, 5, FEAT + STATE
    tr = slot_trajectory(rng, G, T, slot)
    out = team_transitions(tr, L, A)
    assert out["obs"].shape == (G, T, L * slot) and out["action"].shape == (G, T)
    for g in range(G):
        for t in range(T):
            rows = [g * L + a for a in range(L)]  # game g's slots
            np.testing.assert_array_equal(
                out["obs"][g, t], np.concatenate([tr.obs[r, t] for r in rows])
            )
            np.testing.assert_array_equal(
                out["next_obs"][g, t], np.concatenate([tr.next_obs[r, t] for r in rows])
            )
            assert out["action"][g, t] == sum(
                int(tr.action[r, t]) * A**a for a, r in enumerate(rows)
            )
            assert out["reward"][g, t] == pytest.approx(np.mean([tr.reward[r, t] for r in rows]))
    assert out["terminated"][:, 2].all() and not out["terminated"][:, 3].any()
    assert not out["valid"][:, 3].any() and out["valid"][:, 4].all()
    assert not out["priority"].any()
    # What the replay shard of the team layout takes (zrl.replay.layout).
    obs_space = AgentObservationSpace((FEAT,), 0, STATE)
    layout = experience_layout(
        "transitions",
        actions="discrete",
        observation_space=obs_space,
        action_space=gym.spaces.Discrete(A),
        num_envs=G * L,
        trajectory_length=T,
        team=L,
    )
    msg = P.Message(P.TRAJECTORY, meta={"weights_version": 0}, arrays=out, sender="actor")
    assert layout.check(msg) == {"E": G, "T": T, "O": (L * slot,)}
    with pytest.raises(ValueError, match="not whole games"):
        by_game(tr.obs[:-1], L)


def policy_setup(num_envs: int, mask: bool, overrides: list[str] | None = None) -> ActorSetup:
    cfg = load_config(CONFIG, overrides or [])
    sp = space(mask)
    return ActorSetup(
        config=cfg,
        observation_space=sp,
        action_space=gym.spaces.Discrete(A),
        num_envs=num_envs,
        model=QMIXModel(sp, A, L, hidden=(8,)),
        actor_index=0,
        seed=0,
        rng=np.random.default_rng(0),
        log=logging.getLogger("test"),
        train_stats=TrainStats(),
    )


def test_policy_acts_greedily_at_epsilon_zero_and_legally_when_exploring():
    G = 40
    setup = policy_setup(G * L, True, ["qmix.epsilon_start=0", "qmix.epsilon_end=0"])
    policy = QMIXPolicy(setup)
    obs = team_obs(np.random.default_rng(5), G, space(True)).reshape(G * L, -1)
    legal = obs[:, FEAT : FEAT + A] > 0.5
    policy.begin(3, 0)
    a, extras = policy.act(obs, 0)
    q = setup.model(torch.from_numpy(obs)).detach().numpy()
    np.testing.assert_array_equal(a, q.argmax(axis=1))
    assert policy.train_info() == {"epsilon": 0.0} and extras == {}
    explorer = QMIXPolicy(policy_setup(G * L, True))  # epsilon 1 at step 0
    explorer.begin(3, 0)
    a = explorer.act(obs, 1)[0]
    assert legal[np.arange(len(a)), a].all()
    assert len(set(a.tolist())) > 1
    explorer.begin(3, 10**9)  # decayed
    assert explorer.train_info()["epsilon"] == pytest.approx(0.05)


def test_policy_refuses_partial_games():
    with pytest.raises(ValueError, match="not whole games of 3 agents"):
        QMIXPolicy(policy_setup(4, False))


# --- the learner update ---------------------------------------------------------------------


def learner_setup() -> LearnerSetup:
    sp = space()
    return LearnerSetup(
        config=load_config(CONFIG),
        model=QMIXModel(sp, A, L, hidden=(8,)),
        observation_space=sp,
        action_space=gym.spaces.Discrete(A),
        index=0,
        log=logging.getLogger("test"),
        train_stats=TrainStats(),
        services=None,  # type: ignore[arg-type]
    )


def batch_message(B: int, obs_width: int, action: int = 0) -> P.Message:
    rng = np.random.default_rng(0)
    row = np.ones(B, np.float32)
    arrays = {
        "obs": rng.normal(size=(B, obs_width)).astype(np.float32),
        "action": np.full(B, action, np.int64),
        "reward": row,
        "discount": row * 0.9,
        "next_obs": rng.normal(size=(B, obs_width)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": row,
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays, sender="replay-0")


def test_update_receives_team_batches_and_trains():
    up = QMIXUpdate(learner_setup())
    width = L * (FEAT + STATE)
    with pytest.raises(P.ProtocolError):
        up.receive(batch_message(4, FEAT + STATE), 0)  # one slot's width, not the team's
    with pytest.raises(P.ProtocolError, match=r"joint actions outside \[0, 64\)"):
        up.receive(batch_message(4, width, action=A**L), 0)
    up.receive(batch_message(4, width, action=A**L - 1), 0)
    result = up.train(0)
    assert result is not None and result.updates == 1 and result.priorities is None
    assert up.updates == 1 and math.isfinite(float(result.loss))
