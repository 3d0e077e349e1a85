"""Recurrent QMIX (``model.core``): the recurrent agent network, the sequence targets and loss
against a loop written from the paper, the actor's team sequences and the states they start
from, the wiring and layout of team sequences, the learner's receipt."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.algos.test_qmix import reference_mix
from zrl.algos.api.actor import ActorSetup, Trajectory
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.api.train_stats import TrainStats
from zrl.algos.qmix.losses import ILLEGAL_Q, joint_actions, qmix_sequence_update
from zrl.algos.qmix.model import RecurrentQMIXModel, qmix_model_for
from zrl.algos.qmix.policy import QMIXPolicy, RecurrentQMIXPolicy, qmix_policy
from zrl.algos.qmix.update import QMIXUpdate
from zrl.algos.registry import get_algorithm
from zrl.config.experiment import load_config
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.replay.layout import experience_layout
from zrl.transport import messages as M
from zrl.transport import protocol as P

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "simple_spread_qmix.yaml"
L, A, FEAT, STATE, CORE = 3, 4, 5, 6, 7


def space(mask: bool = False) -> AgentObservationSpace:
    return AgentObservationSpace((FEAT,), A if mask else 0, STATE)


def model(mask: bool = False, core: str = "gru", seed: int = 0) -> RecurrentQMIXModel:
    torch.manual_seed(seed)
    return RecurrentQMIXModel(space(mask), A, L, (8,), core, CORE, embed=8, hypernet=16)  # type: ignore[arg-type]


def team_obs(rng: np.random.Generator, shape: tuple[int, ...], sp: AgentObservationSpace):
    """``[*shape, L * slot]``: random features, masks with a legal action, one state per team
    step copied into every agent's slot."""
    slots = rng.normal(size=(*shape, L, sp.shape[0])).astype(np.float32)
    if sp.mask:
        legal = rng.random((*shape, L, A)) < 0.6
        legal[..., 0] |= ~legal.any(axis=-1)
        slots[..., FEAT : FEAT + A] = legal
    slots[..., FEAT + sp.mask :] = rng.normal(size=(*shape, 1, STATE)).astype(np.float32)
    return slots.reshape(*shape, -1)


# --- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_team_unroll_is_each_agent_stepped_from_its_own_state(core: str):
    net = model(mask=True, core=core)
    rng = np.random.default_rng(0)
    B, T = 2, 5
    obs = torch.from_numpy(team_obs(rng, (B, T), space(True)))
    state = torch.randn(B, L * net.state_size)
    first = torch.zeros(B, T, dtype=torch.bool)
    first[1, 3] = True  # game 1 restarts at step 3
    q, final = net.team_unroll(obs, state, first)
    assert q.shape == (B, T, L, A)
    slot = net.slot
    with torch.no_grad():
        for b in range(B):
            for a in range(L):
                s = state[b, a * net.state_size : (a + 1) * net.state_size][None]
                for t in range(T):
                    if first[b, t]:
                        s = torch.zeros_like(s)
                    o = obs[b, t, a * slot : (a + 1) * slot][None]
                    q_step, s = net.step(o, s)
                    torch.testing.assert_close(q[b, t, a], q_step[0], rtol=1e-5, atol=1e-5)
                want = final[b, a * net.state_size : (a + 1) * net.state_size]
                torch.testing.assert_close(want, s[0], rtol=1e-5, atol=1e-5)
    legal = obs.reshape(B, T, L, slot)[..., FEAT : FEAT + A] > 0.5
    assert torch.all(q[~legal] == ILLEGAL_Q) and torch.all(q[legal] > ILLEGAL_Q)


def test_model_for_builds_the_recurrent_network_with_model_core():
    cfg = load_config(CONFIG, ["model.core=lstm", "model.core_size=16"])
    net = qmix_model_for(space(), gym.spaces.Discrete(A), cfg.model, agents=L)
    assert isinstance(net, RecurrentQMIXModel)
    assert net.state_size == 32 and net.agent.core.kind == "lstm"
    feed_forward = qmix_model_for(space(), gym.spaces.Discrete(A), load_config(CONFIG).model, L)
    assert not isinstance(feed_forward, RecurrentQMIXModel)


# --- the sequence targets and loss against the paper ----------------------------------------


def make_sequences(rng: np.random.Generator, net: RecurrentQMIXModel, B: int, T: int, mask: bool):
    """``B`` team sequences of ``T`` steps: sequence 0 starts with its episode after two
    padding steps, sequence 1 ends (terminated) at step T - 3 with end padding, sequence 2
    runs through a truncated episode's end (padding after it, bootstrapped), the rest are
    mid-episode."""
    sp = space(mask)
    obs = team_obs(rng, (B, T + 1), sp)
    real = np.ones((B, T), bool)
    first = np.zeros((B, T + 1), bool)
    terminated = np.zeros((B, T), bool)
    real[0, :2] = False
    first[0, 2] = True
    obs[0, :2] = 0.0
    real[1, T - 2 :] = False
    terminated[1, T - 3] = True
    real[2, T - 1 :] = False
    actions = np.zeros((B, T, L), np.int64)
    for b in range(B):
        for t in range(T):
            for a in range(L):
                row = obs[b, t, a * net.slot : (a + 1) * net.slot]
                legal = np.flatnonzero(row[FEAT : FEAT + A] > 0.5) if mask else np.arange(A)
                actions[b, t, a] = rng.choice(legal) if real[b, t] else 0
    state = rng.normal(size=(B, L * net.state_size)).astype(np.float32)
    state[0] = 0.0  # padding before it: the actor stores zeros
    return {
        "obs": torch.from_numpy(obs),
        "action": torch.from_numpy(joint_actions(actions, A)),
        "reward": torch.from_numpy(np.where(real, rng.normal(size=(B, T)), 0).astype(np.float32)),
        "terminated": torch.from_numpy(terminated),
        "mask": torch.from_numpy(real),
        "first": torch.from_numpy(first),
        "state": torch.from_numpy(state),
        "weight": torch.from_numpy(rng.uniform(0.5, 1.5, B).astype(np.float32)),
    }


def agent_q_loop(net: RecurrentQMIXModel, batch, b: int) -> list[list[list[float]]]:
    """``q[t][a]``: agent ``a``'s Q-values at position ``t`` of sequence ``b``, stepping the
    shared network from the agent's stored state, zeroed where an episode starts."""
    slot, S = net.slot, net.state_size
    out = []
    states = [batch["state"][b, a * S : (a + 1) * S][None] for a in range(L)]
    for t in range(batch["obs"].shape[1]):
        row = []
        for a in range(L):
            if batch["first"][b, t]:
                states[a] = torch.zeros_like(states[a])
            o = batch["obs"][b, t, a * slot : (a + 1) * slot][None]
            q, states[a] = net.step(o, states[a])
            row.append(q[0].tolist())
        out.append(row)
    return out


def q_tot_loop(net: RecurrentQMIXModel, obs_row: torch.Tensor, qs: list[float]) -> float:
    h = [x[0] for x in net.mixer.hyper(obs_row[FEAT + net.mask : net.slot][None])]
    return reference_mix(qs, h[0].tolist(), h[1], h[2], h[3])


def boot_loop(target, batch, b: int, j: int, q_on, q_tg, double: bool) -> float:
    """``Q_tot^-`` of sequence ``b``'s team observation ``j`` at each agent's bootstrap
    action: the online network's argmax valued by the target one (double), or the target's
    max."""
    values = []
    for a in range(L):
        if double:
            best = max(range(A), key=lambda i: q_on[j][a][i])
            values.append(q_tg[j][a][best])
        else:
            values.append(max(q_tg[j][a]))
    return q_tot_loop(target, batch["obs"][b, j], values)


def reference_sequence_loss(online, target, batch, burn_in, gamma, n, double):
    """The loss and each sequence's mean |TD| with plain loops: the agents stepped one by one
    from their stored states, Q_tot mixed per step, n-step returns walked over real steps
    (stopping at a terminal step without a bootstrap), the bootstrap Q_tot^- of the next team
    observation at the agents' double-Q (or max) actions; steps before burn_in excluded."""
    B, T = batch["action"].shape
    total, count, td_means = 0.0, 0, []
    with torch.no_grad():
        for b in range(B):
            q_on, q_tg = agent_q_loop(online, batch, b), agent_q_loop(target, batch, b)
            joint = batch["action"][b].tolist()

            tds = []
            for t in range(burn_in, T):
                if not batch["mask"][b, t]:
                    continue
                qs = [q_on[t][a][(joint[t] // A**a) % A] for a in range(L)]
                q_tot = q_tot_loop(online, batch["obs"][b, t], qs)
                y, k, ended = 0.0, 0, False
                while k < n and t + k < T and batch["mask"][b, t + k]:
                    y += gamma**k * float(batch["reward"][b, t + k])
                    k += 1
                    if batch["terminated"][b, t + k - 1]:
                        ended = True
                        break
                if not ended:
                    y += gamma**k * boot_loop(target, batch, b, t + k, q_on, q_tg, double)
                tds.append(y - q_tot)
                total += float(batch["weight"][b]) * (y - q_tot) ** 2
                count += 1
            td_means.append(np.mean(np.abs(tds)) if tds else 0.0)
    return total / count, np.array(td_means)


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize(
    ("mask", "core", "burn_in", "n"), [(False, "gru", 2, 3), (True, "lstm", 0, 1)]
)
def test_sequence_update_matches_reference_loop(double, mask, core, burn_in, n):
    online = model(mask, core, seed=1)
    target = copy.deepcopy(online)
    for p in target.parameters():  # a target that differs from the online networks
        p.data.add_(0.1 * torch.randn_like(p))
    batch = make_sequences(np.random.default_rng(2), online, B=5, T=7, mask=mask)
    want_loss, want_td = reference_sequence_loss(online, target, batch, burn_in, 0.9, n, double)
    before = copy.deepcopy(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    result = qmix_sequence_update(
        online,
        target,
        opt,
        batch,
        burn_in=burn_in,
        gamma=0.9,
        n_step=n,
        double=double,
        grad_clip=10.0,
    )
    assert result.loss == pytest.approx(want_loss, rel=1e-4)
    np.testing.assert_allclose(result.td, want_td, rtol=1e-4, atol=1e-5)
    after = online.state_dict()
    for part in ("agent.core.", "agent.torso.", "mixer."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(part))


def test_burn_in_steps_carry_no_loss():
    """Rewards and actions inside the burn-in change nothing the loss sees beyond the
    bootstrap: the same loss with any rewards there when n = 1."""
    online = model(seed=3)
    target = copy.deepcopy(online)
    batch = make_sequences(np.random.default_rng(4), online, B=4, T=6, mask=False)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["reward"][:, :2] += 100.0
    kw = {"burn_in": 2, "gamma": 0.9, "n_step": 1, "double": True, "grad_clip": 10.0}
    a = qmix_sequence_update(copy.deepcopy(online), target, _adam(online), batch, **kw)
    kw_online = copy.deepcopy(online)
    b = qmix_sequence_update(kw_online, target, _adam(kw_online), changed, **kw)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    c = qmix_sequence_update(
        copy.deepcopy(online), target, _adam(online), changed, **{**kw, "burn_in": 0}
    )
    assert c.loss != pytest.approx(a.loss, rel=1e-3)


def _adam(net: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(net.parameters(), lr=1e-3)


def test_sequence_update_refuses_missing_keys():
    online = model()
    batch = make_sequences(np.random.default_rng(0), online, B=3, T=5, mask=False)
    del batch["state"]
    with pytest.raises(ValueError, match=r"missing keys \['state'\]"):
        qmix_sequence_update(
            online,
            online,
            _adam(online),
            batch,
            burn_in=1,
            gamma=0.9,
            n_step=1,
            double=True,
            grad_clip=1.0,
        )


# --- the actor policy -----------------------------------------------------------------------


def policy_setup(G: int, overrides: list[str]) -> ActorSetup:
    cfg = load_config(CONFIG, ["model.core=gru", *overrides])
    return ActorSetup(
        config=cfg,
        observation_space=space(),
        action_space=gym.spaces.Discrete(A),
        num_envs=G * L,
        model=model(),
        actor_index=0,
        seed=0,
        rng=np.random.default_rng(0),
        log=logging.getLogger("test"),
        train_stats=TrainStats(),
    )


def test_actor_sequences_start_from_the_states_the_agents_had():
    G, T, SEQ, BURN = 2, 12, 4, 2
    setup = policy_setup(
        G, [f"qmix.sequence_length={SEQ}", f"qmix.burn_in={BURN}", "replay.n_step=1"]
    )
    policy = qmix_policy(setup)
    assert isinstance(policy, RecurrentQMIXPolicy) and not policy.records_next_obs
    E, slot = G * L, FEAT + STATE
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(E, T, slot)).astype(np.float32)
    terminated = np.zeros((E, T), bool)
    valid = np.ones((E, T), bool)
    terminated[:, 6] = True  # every game's episode ends at step 6 ...
    valid[:, 7] = False  # ... step 7 only resets (its observation: the final one)
    policy.begin(T, 0)
    actions, firsts, states = [], [], []
    for t in range(T):
        if t == 8:
            policy.episodes_started(np.arange(E))  # the actor: a new episode from step 8
        a, extras = policy.act(obs[:, t], t)
        actions.append(a)
        firsts.append(extras["first"])
        states.append(extras["state"])
    state = np.stack(states, axis=1)  # [E, T, S]
    assert np.stack(firsts, axis=1)[:, [0, 8]].all() and not np.abs(state[:, 0]).any()
    tr = Trajectory(
        obs=obs,
        next_obs=None,
        action=np.stack(actions, axis=1),
        reward=rng.normal(size=(E, T)).astype(np.float32),
        terminated=terminated,
        truncated=np.zeros((E, T), bool),
        valid=valid,
        final_obs=obs[:, -1],
        extras={"first": np.stack(firsts, axis=1), "state": state},
        weights_version=3,
    )
    out = policy.finish(tr)
    seqs = out.arrays
    S = setup.model.state_size
    team = obs.reshape(G, L, T, slot).transpose(0, 2, 1, 3).reshape(G, T, L * slot)
    team_state = state.reshape(G, L, T, S).transpose(0, 2, 1, 3).reshape(G, T, L * S)
    # Every game: the episode of steps 0..6 gives sequences starting at its steps -2, 0, 2
    # and 4; the next one (from step 8) the one starting at its step -2, complete at step 10.
    assert len(seqs["action"]) == 5 * G, len(seqs["action"])
    started_mid_episode = 0
    for i in range(len(seqs["action"])):
        starts = [
            (g, t)
            for g in range(G)
            for t in range(T)
            if np.array_equal(seqs["obs"][i, 0], team[g, t])
        ]
        if not seqs["mask"][i, 0]:  # padding before the episode: zero obs and state
            assert not seqs["obs"][i, 0].any() and not seqs["state"][i].any()
            continue
        ((g, t),) = starts
        np.testing.assert_array_equal(seqs["state"][i], team_state[g, t])
        for j in range(SEQ):  # the steps that follow, side by side, joint actions
            if seqs["mask"][i, j]:
                np.testing.assert_array_equal(seqs["obs"][i, j], team[g, t + j])
                want = sum(int(tr.action[g * L + a, t + j]) * A**a for a in range(L))
                assert seqs["action"][i, j] == want
                assert seqs["reward"][i, j] == pytest.approx(
                    tr.reward[g * L : g * L + L, t + j].mean()
                )
        started_mid_episode += int(t > 0)
        assert np.abs(seqs["state"][i]).any() == (t > 0)
    assert started_mid_episode == 2 * G  # at steps 2 and 4: the states the agents had there
    assert (seqs["weights_version"] == 3).all() and not seqs["priority"].any()
    # What the replay shard of the team sequence layout takes (zrl.replay.layout).
    layout = experience_layout(
        "sequences",
        actions="discrete",
        observation_space=space(),
        action_space=gym.spaces.Discrete(A),
        num_envs=E,
        trajectory_length=T,
        sequence_length=SEQ,
        state_size=S,
        team=L,
    )
    assert layout.schema is M.SEQUENCES
    msg = P.Message(P.TRAJECTORY, meta={"weights_version": 3}, arrays=seqs, sender="actor")
    assert layout.check(msg) == {"E": 5 * G, "T": SEQ, "P": SEQ + 1, "O": (L * slot,), "R": L * S}
    assert policy.heartbeat_info()["sequences"] == 5 * G


def test_feed_forward_model_gets_the_transitions_policy():
    setup = policy_setup(1, [])
    setup = ActorSetup(**{**setup.__dict__, "config": load_config(CONFIG)})
    from zrl.algos.qmix.model import QMIXModel

    setup.model = QMIXModel(space(), A, L, hidden=(8,))
    policy = qmix_policy(setup)
    assert type(policy) is QMIXPolicy


# --- wiring and the learner -----------------------------------------------------------------


def test_model_core_wires_team_sequences():
    algorithm = get_algorithm("qmix")
    assert algorithm.wiring_for(load_config(CONFIG)).replay_item == "transitions"
    wiring = algorithm.wiring_for(load_config(CONFIG, ["model.core=gru"]))
    assert wiring.replay_item == "sequences" and wiring.team
    assert algorithm.sequence_length is not None
    assert algorithm.sequence_length(load_config(CONFIG, ["qmix.sequence_length=9"])) == 9


def sequence_batch(B: int, T: int, R: int, obs_width: int) -> P.Message:
    rng = np.random.default_rng(0)
    steps = np.ones((B, T), bool)
    arrays = {
        "obs": rng.normal(size=(B, T + 1, obs_width)).astype(np.float32),
        "action": np.full((B, T), A**L - 1, np.int64),
        "reward": np.ones((B, T), np.float32),
        "terminated": ~steps,
        "mask": steps,
        "first": np.zeros((B, T + 1), bool),
        "state": rng.normal(size=(B, R)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays, sender="replay-0")


def test_update_receives_team_sequence_batches_and_trains():
    cfg = load_config(CONFIG, ["model.core=gru", "qmix.sequence_length=6", "qmix.burn_in=2"])
    net = model()
    up = QMIXUpdate(
        LearnerSetup(
            config=cfg,
            model=net,
            observation_space=space(),
            action_space=gym.spaces.Discrete(A),
            index=0,
            log=logging.getLogger("test"),
            train_stats=TrainStats(),
            services=None,  # type: ignore[arg-type]
        )
    )
    width, R = L * (FEAT + STATE), L * net.state_size
    with pytest.raises(P.ProtocolError):
        up.receive(sequence_batch(4, 6, net.state_size, width), 0)  # one agent's state
    with pytest.raises(P.ProtocolError):
        up.receive(sequence_batch(4, 5, R, width), 0)  # sequences of another length
    up.receive(sequence_batch(4, 6, R, width), 0)
    result = up.train(0)
    assert result is not None and result.updates == 1 and result.priorities is None
    assert np.isfinite(float(result.loss))
