"""R2D2 beyond its pure math (``test_r2d2_losses.py``): how the actor cuts sequences, that a
learner replaying a stored state reproduces the actor's Q-values, what replay accepts, and one
learner update.

The cutting reference is written from the definition (``zrl.algos.kernel.sequences``): in an
episode of n steps, sequence j starts at episode step ``-burn_in + j * (L - burn_in)`` and is
sent while its trained part ``[start + burn_in, start + L)`` holds a step of the episode.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.helpers.frames import SHAPE, Collector, act_on, first_of, scripted_actions
from zrl.algos.api.actor import Trajectory
from zrl.algos.kernel.sequences import SequenceCutter
from zrl.algos.r2d2 import update as r2d2_update
from zrl.algos.r2d2.config import R2D2Config
from zrl.algos.r2d2.policy import R2D2Policy, actor_priorities
from zrl.algos.r2d2.update import R2D2Update
from zrl.codecs.frames import sequence_stacks_from_frames
from zrl.config.experiment import ExperimentConfig
from zrl.nets.recurrent import recurrent_q_network_for
from zrl.replay.assemble import assemble_items, assemble_sequences
from zrl.replay.layout import experience_layout
from zrl.replay.tables import make_table
from zrl.testing.fakes import actor_setup, as_message, learner_setup, sequences
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate

OBS = 2  # observation width of the synthetic streams
STATE = 2


def stream(lengths: list[int], terminal: list[bool]) -> dict[str, np.ndarray]:
    """One env's steps as the actor records them (NEXT_STEP autoreset): each episode's steps,
    then the step that only resets the env (invalid; its observation is the final one). Every
    observation, state and Q-value is unique: ``id`` = 1000 * episode + step."""
    rows: list[dict[str, object]] = []
    for ep, (n, term) in enumerate(zip(lengths, terminal, strict=True)):
        for i in range(n + 1):
            ident = 1000.0 * (ep + 1) + i
            rows.append(
                {
                    "obs": [ident, -ident],
                    "action": int(ident) % 3,
                    "reward": ident / 7,
                    "terminated": term and i == n - 1,
                    "valid": i < n,
                    "first": i == 0,
                    "state": [ident + 0.25, ident + 0.5],
                    "q": [ident, ident + 1, ident + 2],
                }
            )
    return {
        "obs": np.array([r["obs"] for r in rows], np.float32),
        "action": np.array([r["action"] for r in rows], np.int64),
        "reward": np.array([r["reward"] for r in rows], np.float32),
        "terminated": np.array([r["terminated"] for r in rows], bool),
        "valid": np.array([r["valid"] for r in rows], bool),
        "first": np.array([r["first"] for r in rows], bool),
        "state": np.array([r["state"] for r in rows], np.float32),
        "q": np.array([r["q"] for r in rows], np.float32),
    }


def reference(lengths: list[int], terminal: list[bool], L: int, burn_in: int) -> list[dict]:
    """The sequences of the finished episodes, from the definition."""
    out = []
    period = L - burn_in
    for ep, (n, term) in enumerate(zip(lengths, terminal, strict=True)):

        def ident(i: int, ep: int = ep) -> float:  # the stream's numbering
            return 1000.0 * (ep + 1) + i

        start = -burn_in
        while start + burn_in < n:
            seq = {
                "obs": np.zeros((L + 1, OBS), np.float32),
                "action": np.zeros(L, np.int64),
                "reward": np.zeros(L, np.float32),
                "terminated": np.zeros(L, bool),
                "mask": np.zeros(L, bool),
                "first": np.zeros(L + 1, bool),
                "state": np.zeros(STATE, np.float32),
            }
            for j in range(L):
                i = start + j
                if 0 <= i < n:
                    seq["obs"][j] = [ident(i), -ident(i)]
                    seq["action"][j] = int(ident(i)) % 3
                    seq["reward"][j] = np.float32(ident(i) / 7)
                    seq["terminated"][j] = term and i == n - 1
                    seq["mask"][j] = True
                    seq["first"][j] = i == 0
            # After the last real step: the next step's observation, or the final one (i == n).
            last = min(L, n - start)
            seq["obs"][last] = [ident(start + last), -ident(start + last)]
            if start >= 0:
                seq["state"][:] = [ident(start) + 0.25, ident(start) + 0.5]
            out.append(seq)
            start += period
    return out


def cut(data: dict[str, np.ndarray], L: int, burn_in: int, chunk: int) -> list[dict]:
    """Feed one env's stream to a cutter ``chunk`` steps at a time; the sequences in order."""
    cutter = SequenceCutter(1, L, burn_in, (OBS,), np.dtype(np.float32), STATE, 3)
    out = []
    for t in range(0, len(data["valid"]), chunk):
        part = {k: v[None, t : t + chunk] for k, v in data.items()}
        seqs = cutter.add(
            part["obs"],
            part["action"],
            part["reward"],
            part["terminated"],
            part["valid"],
            part["first"],
            part["state"],
            part["q"],
        )
        for k in range(len(seqs)):
            out.append({name: arr[k] for name, arr in seqs.arrays(np.zeros(len(seqs))).items()})
    return out


@pytest.mark.parametrize(
    ("lengths", "L", "burn_in"),
    [
        ([3, 25, 1, 8], 8, 4),  # short episodes, one of a single step
        ([16, 17, 15], 8, 4),  # ends on, after and before a sequence boundary
        ([30, 7], 10, 0),  # no burn-in: no overlap, no front padding
        ([40, 12], 10, 7),  # overlap of 7 (period 3)
        ([5], 1, 0),  # sequences of one step
    ],
)
@pytest.mark.parametrize("chunk", [1, 4, 7, 100])
def test_sequences_match_the_definition(lengths, L, burn_in, chunk):
    terminal = [i % 2 == 0 for i in range(len(lengths))]  # terminated and truncated ends
    got = cut(stream(lengths, terminal), L, burn_in, chunk)
    want = reference(lengths, terminal, L, burn_in)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=f"sequence {k}: {name}")


def test_a_sequence_carries_the_oldest_weights_version_that_acted_in_it():
    """Sequences span trajectories: one trajectory of 4 steps per weights version (10, 11, ...),
    each sequence stamped with the version of its earliest real step."""
    data = stream([21], [True])  # one episode: step i is at stream position i
    cutter = SequenceCutter(1, 6, 2, (OBS,), np.dtype(np.float32), STATE, 3)
    got = []
    for t in range(0, len(data["valid"]), 4):
        part = {k: v[None, t : t + 4] for k, v in data.items()}
        seqs = cutter.add(
            *(
                part[k]
                for k in ("obs", "action", "reward", "terminated", "valid", "first", "state", "q")
            ),
            version=10 + t // 4,
        )
        got += zip(seqs.weights_version.tolist(), seqs.obs[..., 0], seqs.mask, strict=True)
    assert len(got) == 6  # trained parts of 4 steps tile the 21 (the first's burn-in: padding)
    for version, obs, mask in got:
        earliest = int(obs[:-1][mask].min()) % 1000  # the episode step = the stream position
        assert version == 10 + earliest // 4
    assert {v for v, _, _ in got} == {10, 11, 12, 13, 14}


def test_trained_parts_tile_every_episode_once():
    lengths, L, burn_in = [37, 9, 80], 12, 5
    seqs = cut(stream(lengths, [True, False, True]), L, burn_in, 6)
    trained = [s["obs"][burn_in:L][s["mask"][burn_in:]][:, 0] for s in seqs]
    ids = np.sort(np.concatenate(trained))
    want = np.sort([1000.0 * (ep + 1) + i for ep, n in enumerate(lengths) for i in range(n)])
    np.testing.assert_array_equal(ids, want)


def test_an_unfinished_episode_sends_only_complete_sequences_and_a_restart_drops_it():
    data = stream([50], [True])
    part = {k: v[:20] for k, v in data.items()}  # 20 steps, the episode goes on
    seqs = cut(part, 8, 4, 5)
    # Starts -4, 0, 4 and 8 (its last step 15, then step 16's observation); the one at 12
    # ends at step 19 and waits for step 20's observation.
    assert len(seqs) == 4
    assert all(s["mask"][4:].all() for s in seqs)
    cutter = SequenceCutter(1, 8, 4, (OBS,), np.dtype(np.float32), STATE, 3)
    args = [part[k][None] for k in ("obs", "action", "reward", "terminated", "valid")]
    cutter.add(*args, part["first"][None], part["state"][None], part["q"][None])
    restarted = part["first"].copy()
    restarted[:] = False
    restarted[0] = True  # all envs reset after an env error: the episode is gone
    cutter.add(*args, restarted[None], part["state"][None], part["q"][None])
    assert cutter.discarded == 1


# --- the policy, the stored state and the learner -------------------------------------------


def config(**r2d2: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "algo": "r2d2",
            "env": {"id": "zrl/CartPoleNoVel-v1", "num_envs": 3},
            "model": {"core": "lstm", "core_size": 8, "hidden": [16]},
            "r2d2": {"sequence_length": 6, "burn_in": 2, **r2d2},
            "replay": {"n_step": 2, "batch_size": 4},
            "roles": {"actors": 1},
        }
    )


def spaces():
    import gymnasium as gym

    import zrl.envs.vector  # noqa: F401 - registers zrl/CartPoleNoVel-v1

    env = gym.make("zrl/CartPoleNoVel-v1")
    return env.observation_space, env.action_space


def policy_for(cfg: ExperimentConfig, model: torch.nn.Module) -> R2D2Policy:

    obs_space, act_space = spaces()
    return R2D2Policy(actor_setup(cfg, model, obs_space, act_space, 3))


def test_stored_state_replay_reproduces_the_actors_q_values():
    """Sequences cut from an actor's steps, unrolled by the learner from their stored states
    with the same weights, give exactly the Q-values the actor acted on."""
    cfg = config()
    torch.manual_seed(0)
    model = recurrent_q_network_for(*spaces(), cfg.model)
    policy = policy_for(cfg, model)
    rng = np.random.default_rng(1)
    E, T = 3, 5
    done_at = {(0, 3), (1, 7), (2, 12)}  # episode ends in, and across, trajectories
    needs_reset = np.zeros(E, bool)
    emitted = []
    for k in range(4):
        policy.begin(T, 0)
        obs = rng.normal(size=(E, T, 2)).astype(np.float32)
        term = np.zeros((E, T), bool)
        valid = np.ones((E, T), bool)
        extras: dict[str, list[np.ndarray]] = {"first": [], "state": [], "q": []}
        actions = []
        for t in range(T):
            if needs_reset.any():
                valid[needs_reset, t] = False
            a, x = policy.act(obs[:, t], t)
            actions.append(a)
            for name in extras:
                extras[name].append(x[name])
            now = np.array([(e, k * T + t) in done_at for e in range(E)])
            term[:, t] = now
            reset_now = needs_reset.copy()
            needs_reset = now
            if reset_now.any():
                policy.episodes_started(np.flatnonzero(reset_now))
        seqs = policy.cutter.add(
            obs,
            np.stack(actions, 1),
            np.ones((E, T), np.float32),
            term,
            valid,
            *(np.stack(extras[n], 1) for n in ("first", "state", "q")),
        )
        emitted.append(seqs)
    assert sum(len(s) for s in emitted) >= 3
    for seqs in emitted:
        if not len(seqs):
            continue
        with torch.no_grad():
            q, _ = model.unroll(
                torch.from_numpy(seqs.obs),
                torch.from_numpy(seqs.state),
                torch.from_numpy(seqs.first),
            )
        real = np.concatenate([seqs.mask, seqs.mask[:, -1:]], axis=1)  # and the last obs
        real[:, 1:] |= seqs.mask  # the observation after a sequence's last real step
        np.testing.assert_allclose(q.numpy()[real], seqs.q[real], rtol=0, atol=1e-6)


def test_the_actors_sequences_carry_the_version_that_acted():
    """``R2D2Policy.finish`` sends a ``sequences`` TRAJECTORY whose sequences are stamped
    with the weights version of the trajectory they came from."""
    cfg = config()
    torch.manual_seed(0)
    policy = policy_for(cfg, recurrent_q_network_for(*spaces(), cfg.model))
    E, T = 3, 8
    rng = np.random.default_rng(2)
    obs = rng.normal(size=(E, T, 2)).astype(np.float32)
    policy.begin(T, 0)
    acted = [policy.act(obs[:, t], t) for t in range(T)]
    term, valid = np.zeros((E, T), bool), np.ones((E, T), bool)
    term[:, 3], valid[:, 4] = True, False  # every env's episode ends at step 3
    trajectory = Trajectory(
        obs=obs,
        next_obs=None,
        action=np.stack([a for a, _ in acted], 1),
        reward=np.ones((E, T), np.float32),
        terminated=term,
        truncated=np.zeros_like(term),
        valid=valid,
        final_obs=obs[:, -1],
        extras={n: np.stack([x[n] for _, x in acted], 1) for n in ("first", "state", "q")},
        weights_version=7,
    )
    out = policy.finish(trajectory)
    sizes = validate(as_message(out.arrays), M.SEQUENCES)
    assert sizes["E"] == E and out.arrays["weights_version"].tolist() == [7] * E


def test_actor_priorities_are_the_eta_mix_of_its_own_td_errors():
    cfg = config()
    data = stream([9], [True])
    seqs_list = cut(data, 6, 2, 100)
    cutter = SequenceCutter(1, 6, 2, (OBS,), np.dtype(np.float32), STATE, 3)
    seqs = cutter.add(
        *(
            data[k][None]
            for k in ("obs", "action", "reward", "terminated", "valid", "first", "state", "q")
        )
    )
    assert len(seqs) == len(seqs_list) == 3
    prio = actor_priorities(seqs, 2, 0.9, 2, 0.9, 1e-3)
    assert prio.shape == (3,) and np.all(prio > 0) and cfg.section(R2D2Config).priority_eta == 0.9


def sequence_message(n: int = 4, **changes: np.ndarray) -> P.Message:
    return as_message({**sequences(n), **changes}, weights_version=1, actor=0, env_steps=0)


def test_replay_takes_sequences_and_refuses_malformed_ones():
    items, priorities = assemble_sequences(sequence_message())
    assert set(items) == {
        "obs",
        "action",
        "reward",
        "terminated",
        "mask",
        "first",
        "state",
        "weights_version",
    }
    assert priorities.shape == (4,)
    short = {"obs": np.zeros((4, 6, 2), np.float32), "first": np.zeros((4, 6), bool)}
    with pytest.raises(P.ProtocolError, match="6 observations, not 7"):
        assemble_sequences(sequence_message(**short))
    with pytest.raises(P.ProtocolError, match="negative priorities"):
        assemble_sequences(sequence_message(priority=-np.ones(4, np.float32)))
    with pytest.raises(P.ProtocolError, match="state"):
        assemble_sequences(sequence_message(state=np.full((4, 16), np.nan, np.float32)))


def update_for(cfg: ExperimentConfig) -> R2D2Update:

    torch.manual_seed(0)
    obs_space, act_space = spaces()
    model = recurrent_q_network_for(obs_space, act_space, cfg.model)
    return R2D2Update(learner_setup(cfg, model, obs_space, act_space))


def batch_message(n: int = 4) -> P.Message:
    msg = sequence_message(n)
    arrays = {k: v for k, v in msg.arrays.items() if k != "priority"}
    arrays["weight"] = np.ones(n, np.float32)
    arrays["key"] = np.arange(n, dtype=np.int64)
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)


def test_learner_update_trains_and_returns_sequence_priorities():
    update = update_for(config())
    msg = batch_message()
    losses = []
    for _ in range(20):
        update.receive(msg, 0)
        result = update.train(0)
        assert result is not None and result.priorities is not None
        assert result.priorities.keys.tolist() == [0, 1, 2, 3]
        assert result.priorities.priorities.shape == (4,)
        losses.append(result.loss)
    assert losses[-1] < 0.75 * losses[0]


def test_learner_refuses_a_batch_of_another_sequence_length():
    update = update_for(config(sequence_length=8, burn_in=2))
    with pytest.raises(P.ProtocolError, match="P must be 9"):
        update.receive(batch_message(), 0)


# --- frame stacks: each frame once per sequence ---------------------------------------------

FRAME_SPACE = gym.spaces.Box(0, 255, (4, *SHAPE), np.uint8)  # stacks of 4 scripted frames
FRAME_ACTIONS = gym.spaces.Discrete(3)


def frame_config(**r2d2: object) -> ExperimentConfig:
    cfg = config(**r2d2).model_dump(mode="json")
    cfg["model"]["encoder"] = "mlp"
    cfg["env"]["num_envs"] = 5
    return ExperimentConfig.model_validate(cfg)


def frame_sizes(L: int, R: int = STATE, k: int = 4) -> dict[str, object]:
    return {"O": SHAPE, "S": L + k, "T": L, "P": L + 1, "R": R}


@pytest.mark.parametrize("padding", ["zero", "reset"])
@pytest.mark.parametrize("burn_in", [0, 2])
def test_frame_sequences_rebuild_the_actors_stacks_exactly(padding: str, burn_in: int):
    """Sequences cut from frame-stacked envs (episode ends inside and across trajectories,
    one-step episodes, a burn-in padded in front, sequences padded after an episode's end)
    travel as ``frame_sequences`` and rebuild, from ``first`` and ``mask`` alone, into
    exactly the stacks the actor cut, padding included."""
    E, T, L, k = 5, 8, 5, 4
    collector = Collector(E, k, padding)
    cutter = SequenceCutter(E, L, burn_in, (k, *SHAPE), np.dtype(np.uint8), STATE, 3)
    started = np.ones(E, bool)
    rng = np.random.default_rng(burn_in)
    rounds = scripted_actions(T, E) + [rng.choice(3, (T, E), p=[0.7, 0.2, 0.1]) for _ in range(4)]
    sent = []
    for actions in rounds:
        traj = collector.collect(actions)
        seqs = cutter.add(
            traj["obs"],
            traj["action"],
            traj["reward"],
            traj["terminated"],
            traj["valid"],
            first_of(traj, started),
            np.zeros((E, T, STATE), np.float32),
            np.zeros((E, T, 3), np.float32),
        )
        arrays = seqs.arrays(np.ones(len(seqs), np.float32), frames=True)
        validate(as_message(arrays), M.FRAME_SEQUENCES, **frame_sizes(L))
        sent.append((seqs, arrays))
    obs = np.concatenate([s.obs for s, _ in sent])
    a = {name: np.concatenate([arrays[name] for _, arrays in sent]) for name in sent[0][1]}
    assert a["frames"].nbytes * k == obs.nbytes * (L + k) // (L + 1)  # (L + k) frames, not k(L + 1)
    first, mask = a["first"], a["mask"]
    assert first[:, 1:].any() == (burn_in > 0)  # an episode's first sequence, padded in front
    assert (~first.any(axis=1)).any()  # sequences that start inside an episode
    assert (~mask[:, -1]).sum() >= 3  # sequences padded after an episode's end
    rebuilt = sequence_stacks_from_frames(
        torch.from_numpy(a["frames"]), torch.from_numpy(first), torch.from_numpy(mask), padding
    )
    assert rebuilt.dtype == torch.uint8
    np.testing.assert_array_equal(rebuilt.numpy(), obs)


def test_r2d2_on_frame_stacks_sends_each_frame_once_and_trains_on_the_actors_stacks(monkeypatch):
    """The policy on frame stacks sends ``frame_sequences`` of the replay layout its spaces
    fix; a shard stores them and samples ``frame_sequence_batch``es; the learner (whose schema
    comes from its spaces: it refuses full stacks) trains on exactly the stacks the actor cut."""
    cfg = frame_config()
    c = cfg.section(R2D2Config)
    L, E, T = c.sequence_length, 5, 8
    torch.manual_seed(0)
    model = recurrent_q_network_for(FRAME_SPACE, FRAME_ACTIONS, cfg.model)
    policy = R2D2Policy(actor_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS, E))
    layout = experience_layout(
        "sequences",
        actions="discrete",
        observation_space=FRAME_SPACE,
        action_space=FRAME_ACTIONS,
        num_envs=E,
        trajectory_length=T,
        sequence_length=L,
        state_size=model.state_size,
    )
    assert layout.schema is M.FRAME_SEQUENCES and layout.stack == 4
    reference = SequenceCutter(
        E, L, c.burn_in, (4, *SHAPE), np.dtype(np.uint8), model.state_size, 3
    )
    table = make_table("fifo", 64)
    expected = []
    collector = Collector(E, 4, seed=3)
    for actions in scripted_actions(T, E) + scripted_actions(T, E):
        trajectory = act_on(policy, collector.collect(actions))
        out = policy.finish(trajectory)
        msg = as_message(out.arrays, weights_version=1, actor=0, env_steps=0)
        assert set(out.arrays) == set(M.FRAME_SEQUENCES.arrays)
        layout.check(msg)
        items, _ = assemble_items(layout, msg, cfg.replay.n_step, cfg.replay.gamma)
        if len(items["reward"]):
            table.insert(items)
        x = trajectory.extras
        expected.append(
            reference.add(
                trajectory.obs,
                trajectory.action,
                trajectory.reward,
                trajectory.terminated,
                trajectory.valid,
                x["first"],
                x["state"],
                x["q"],
            ).obs
        )
    stacks = np.concatenate(expected)
    assert len(stacks) == table.size >= 6
    sampled = table.sample(table.size, np.random.default_rng(0))  # oldest first
    arrays = {**sampled.items, "weight": sampled.weights, "key": sampled.keys.astype(np.int64)}
    batch = P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)
    validate(batch, M.FRAME_SEQUENCE_BATCH, **frame_sizes(L, model.state_size))

    update = R2D2Update(learner_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS))
    assert update.schema is M.FRAME_SEQUENCE_BATCH
    full = {k: v for k, v in arrays.items() if k != "frames"}
    with pytest.raises(P.ProtocolError, match="frames"):
        update.receive(P.Message(P.BATCH, meta=batch.meta, arrays={**full, "obs": stacks}), 0)
    seen: list[torch.Tensor] = []
    unroll = r2d2_update.burn_in_unroll
    monkeypatch.setattr(
        r2d2_update, "burn_in_unroll", lambda f, obs, *a: seen.append(obs) or unroll(f, obs, *a)
    )
    update.receive(batch, 0)
    result = update.train(0)
    assert result is not None and np.isfinite(result.loss) and len(seen) == 1
    np.testing.assert_array_equal(seen[0].numpy(), stacks)
