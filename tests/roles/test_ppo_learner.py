"""``RoundBuffer`` (which rollouts form a PPO round) and ``round_tensors`` (the round's samples).

The property tests feed random interleavings of rollouts from several actors and weights
versions, with a clock passed as ``now``, and check the round rules after every step: a
synchronous round never mixes weights versions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.frames import SHAPE, Collector, scripted_actions
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.ppo.rounds import Rollout, RoundBuffer, round_tensors
from zrl.codecs.frames import frames_of
from zrl.nets.discrete import ActorCritic
from zrl.transport.messages import FRAME_UNROLL, UNROLL

torch.set_num_threads(1)
SETTINGS = settings(max_examples=150, deadline=None)
TIMEOUT = 5.0


def rollout(version: int, actor: int, received: float = 0.0) -> Rollout:
    return Rollout(version=version, actor=actor, arrays={}, received=received)


# Events: ("add", actor, version, dt) or ("take", dt); dt advances the clock first.
add_events = st.tuples(
    st.just("add"), st.integers(0, 3), st.integers(1, 6), st.sampled_from([0.0, 0.5, 2.0, 6.0])
)
take_events = st.tuples(st.just("take"), st.sampled_from([0.0, 0.5, 2.0, 6.0]))
event_lists = st.lists(st.one_of(add_events, take_events), min_size=5, max_size=80)


# ----------------------------------------------------------------------------- sync


@SETTINGS
@given(events=event_lists, round_size=st.integers(1, 4))
def test_sync_rounds_never_mix_versions(events, round_size):
    buf = RoundBuffer("sync", round_size=round_size, max_lag=1, round_timeout=TIMEOUT)
    now = 0.0
    sent: set[tuple[int, int]] = set()  # a sync actor sends one rollout per version
    live: list[Rollout] = []  # accepted, not yet trained, not superseded
    returned: set[int] = set()
    rejected = 0
    rounds: list[list[Rollout]] = []
    for event in events:
        now += event[-1]
        if event[0] == "add":
            _, actor, version, _ = event
            if (actor, version) in sent:
                continue
            sent.add((actor, version))
            r = rollout(version, actor, received=now)
            trained = buf.trained_version
            accepted = buf.add(r, current_version=trained + 1)
            # A rollout of a version already trained (or older) is stale, and counted.
            assert accepted == (version > trained)
            if accepted:
                live.append(r)
            else:
                rejected += 1
            assert buf.stale == rejected
            continue

        short_before = buf.short_rounds
        chosen = buf.take(current_version=buf.trained_version + 1, now=now)
        if chosen is None:
            assert buf.short_rounds == short_before
            if live:
                # Not taken: the newest version's group is incomplete and has not timed out.
                newest = max(r.version for r in live)
                group = [r for r in live if r.version == newest]
                assert len(group) < round_size
                assert now - min(r.received for r in group) < TIMEOUT
            continue

        assert 1 <= len(chosen) <= round_size
        versions = {r.version for r in chosen}
        assert len(versions) == 1, f"a sync round mixed versions {versions}"
        version = versions.pop()
        assert buf.trained_version == version
        if rounds:
            assert version > rounds[-1][0].version  # successive rounds: strictly newer
        # The round is the newest version's group, one rollout per actor, in actor order.
        newest = max(r.version for r in live)
        group = [r for r in live if r.version == newest]
        assert version == newest
        assert len(chosen) == min(round_size, len(group))
        assert all(any(c is g for g in group) for c in chosen)
        assert [r.actor for r in chosen] == sorted({r.actor for r in chosen})
        assert not any(id(r) in returned for r in chosen)  # nothing is trained twice
        returned.update(id(r) for r in chosen)
        if len(chosen) < round_size:
            # A short round only after the timeout, and counted.
            assert now - min(r.received for r in chosen) >= TIMEOUT
            assert buf.short_rounds == short_before + 1
        else:
            assert buf.short_rounds == short_before
        rounds.append(chosen)
        kept = [r for r in live if r.version > version]
        rejected += len(live) - len(chosen) - len(kept)  # superseded: counted stale too
        live = kept
        assert {id(r) for r in buf.pending} == {id(r) for r in live}
    assert buf.stale == rejected
    assert buf.short_rounds == sum(len(r) < round_size for r in rounds)


@SETTINGS
@given(
    actors=st.integers(1, 4),
    versions=st.integers(1, 6),
    dead=st.sets(st.integers(0, 3)),
    late=st.sets(st.integers(0, 3)),
    seed=st.integers(0, 2**32 - 1),
)
def test_sync_learner_loop_trains_every_version_once(actors, versions, dead, late, seed):
    """A learner and its actors in lock-step: every actor collects one rollout per published
    version, in random order; dead actors send nothing, late ones send after the timeout
    (their rollouts are then stale). Every version is trained exactly once, on its own
    rollouts only, and the short rounds are exactly those with a dead or late actor."""
    rng = np.random.default_rng(seed)
    buf = RoundBuffer("sync", round_size=actors, max_lag=1, round_timeout=TIMEOUT)
    alive = [a for a in range(actors) if a not in dead]
    now, current, stale = 0.0, 1, 0
    trained: list[int] = []
    for _ in range(versions):
        punctual = [a for a in alive if a not in late]
        chosen = None
        for i, a in enumerate(rng.permutation(punctual)):
            now += 0.1
            assert buf.add(rollout(current, int(a), now), current)
            chosen = buf.take(current, now)
            # Complete only with the last actor's rollout (and only if none is missing).
            assert (chosen is not None) == (i == actors - 1)
        if len(punctual) < actors:
            now += TIMEOUT
            chosen = buf.take(current, now)
        if not punctual:
            assert chosen is None  # nothing to train: the learner waits
            break
        assert chosen is not None
        assert [r.actor for r in chosen] == sorted(punctual)
        assert {r.version for r in chosen} == {current}
        trained.append(current)
        # The late actors' rollouts of this version arrive after it was trained: stale.
        for a in late & set(alive):
            assert not buf.add(rollout(current, a, now), current + 1)
            stale += 1
        current += 1
    assert trained == list(range(1, len(trained) + 1))
    assert buf.stale == stale
    short = len(trained) if any(a in dead or a in late for a in range(actors)) else 0
    assert buf.short_rounds == short


def test_sync_hand_example():
    buf = RoundBuffer("sync", round_size=3, max_lag=1, round_timeout=TIMEOUT)
    for actor in (2, 0):
        assert buf.add(rollout(1, actor, received=10.0), 1)
    assert buf.take(1, now=10.0) is None
    assert buf.take(1, now=10.0 + TIMEOUT - 0.01) is None  # incomplete, not timed out yet
    assert buf.add(rollout(1, 1, received=11.0), 1)
    full = buf.take(1, now=11.0)
    assert full is not None and [r.actor for r in full] == [0, 1, 2]
    assert buf.trained_version == 1 and buf.short_rounds == 0 and buf.pending == []
    # A late rollout of version 1 is stale now.
    assert not buf.add(rollout(1, 0, received=12.0), 2)
    assert buf.stale == 1
    # Version 2: one actor died; the round comes out short after the timeout.
    buf.add(rollout(2, 1, received=20.0), 2)
    buf.add(rollout(2, 0, received=21.0), 2)
    assert buf.take(2, now=20.0 + TIMEOUT - 0.01) is None
    short = buf.take(2, now=20.0 + TIMEOUT)
    assert short is not None and [r.actor for r in short] == [0, 1]
    assert buf.short_rounds == 1 and buf.trained_version == 2


def test_sync_superseded_rollouts_are_counted_stale():
    buf = RoundBuffer("sync", round_size=2, max_lag=1, round_timeout=TIMEOUT)
    assert buf.add(rollout(1, 0, received=0.0), 2)
    assert buf.add(rollout(2, 1, received=0.0), 2)
    chosen = buf.take(2, now=TIMEOUT)
    assert chosen is not None and [r.version for r in chosen] == [2]
    # Every rollout received is trained on, stale, or still pending.
    assert len(chosen) + buf.stale + len(buf.pending) == 2


# ----------------------------------------------------------------------------- async


@SETTINGS
@given(
    events=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 3), st.integers(-4, 0)),
            st.tuples(st.just("take"), st.booleans()),
        ),
        max_size=80,
    ),
    round_size=st.integers(1, 4),
    max_lag=st.integers(0, 3),
)
def test_async_rounds_bound_the_lag(events, round_size, max_lag):
    """Rollouts more than max_lag versions behind are dropped and counted; a round is exactly
    round_size rollouts, first come first served; nothing is lost or used twice."""
    buf = RoundBuffer("async", round_size=round_size, max_lag=max_lag, round_timeout=TIMEOUT)
    current = 5
    queue: list[Rollout] = []
    stale = added = trained = 0
    for event in events:
        if event[0] == "add":
            _, actor, offset = event
            r = rollout(current + offset, actor)
            added += 1
            accepted = buf.add(r, current)
            assert accepted == (-offset <= max_lag)
            if accepted:
                queue.append(r)
            else:
                stale += 1
            assert buf.stale == stale
            continue
        _, bump = event
        if bump:  # the learner published a new version meanwhile
            current += 1
        # Far in the future: async rounds never wait for a timeout, nor come out short.
        chosen = buf.take(current, now=1e9)
        fresh = [r for r in queue if current - r.version <= max_lag]
        stale += len(queue) - len(fresh)
        queue = fresh
        if len(queue) < round_size:
            assert chosen is None
        else:
            assert chosen is not None and len(chosen) == round_size
            assert all(a is b for a, b in zip(chosen, queue[:round_size], strict=True))
            assert all(current - r.version <= max_lag for r in chosen)
            queue = queue[round_size:]
            trained += round_size
        assert buf.stale == stale
        assert buf.short_rounds == 0
        assert [id(r) for r in buf.pending] == [id(r) for r in queue]
    assert added == trained + stale + len(buf.pending)


# ----------------------------------------------------------------------------- round_tensors

OBS_DIM, NUM_ACTIONS = 3, 2


def rollout_arrays(seed: int, E: int = 2, T: int = 6) -> dict[str, np.ndarray]:
    """An actor's rollout: env 0 terminated at t=1 (t=2 invalid) and truncated on the last
    step; env 1 invalid at t=0 and truncated at t=3 (t=4 invalid)."""
    rng = np.random.default_rng(seed)
    term, trunc, valid = np.zeros((E, T), bool), np.zeros((E, T), bool), np.ones((E, T), bool)
    term[0, 1], valid[0, 2], trunc[0, T - 1] = True, False, True
    valid[1, 0], trunc[1, 3], valid[1, 4] = False, True, False
    reward = rng.uniform(0, 1, (E, T)).astype(np.float32)
    reward[~valid] = 0.0
    arrays: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(E, T, OBS_DIM)).astype(np.float32),
        "action": rng.integers(NUM_ACTIONS, size=(E, T)).astype(np.int64),
        "logp": np.log(rng.uniform(0.2, 0.8, (E, T))).astype(np.float32),
        "reward": reward,
        "terminated": term,
        "truncated": trunc,
        "valid": valid,
        "bootstrap_obs": rng.normal(size=(E, OBS_DIM)).astype(np.float32),
    }
    assert set(arrays) == set(UNROLL.arrays)
    return arrays


def test_round_tensors_valid_samples_and_gae():
    torch.manual_seed(0)
    model = ActorCritic(OBS_DIM, NUM_ACTIONS, hidden=(8,), activation="tanh")
    rollouts = [Rollout(3, a, rollout_arrays(seed=a)) for a in range(3)]
    gamma, lam = 0.9, 0.8
    data = round_tensors(model, rollouts, gamma, lam)

    # Reference: per rollout, rows in order, valid steps only.
    rows: dict[str, list[Any]] = {k: [] for k in ("obs", "action", "logp", "value", "adv", "ret")}
    for r in rollouts:
        a = r.arrays
        E, T = a["reward"].shape
        with torch.no_grad():
            values = model.value(torch.from_numpy(a["obs"].reshape(E * T, -1))).numpy()
            values = values.reshape(E, T)
            boot = model.value(torch.from_numpy(a["bootstrap_obs"])).numpy()
        adv, ret = rollout_gae(
            a["reward"], values, a["terminated"], a["truncated"], a["valid"], boot, gamma, lam
        )
        for e in range(E):
            for t in range(T):
                if a["valid"][e, t]:
                    rows["obs"].append(a["obs"][e, t])
                    rows["action"].append(a["action"][e, t])
                    rows["logp"].append(a["logp"][e, t])
                    rows["value"].append(values[e, t])
                    rows["adv"].append(adv[e, t])
                    rows["ret"].append(ret[e, t])
    n = len(rows["obs"])
    assert n == 3 * (12 - 3)
    assert set(data) == {"obs", "action", "logp", "value", "advantage", "return"}
    assert all(len(v) == n for v in data.values())
    assert data["obs"].shape == (n, OBS_DIM) and data["obs"].dtype == torch.float32
    assert data["action"].dtype == torch.int64
    for key in ("logp", "value", "advantage", "return"):
        assert data[key].dtype == torch.float32, key
    np.testing.assert_array_equal(data["obs"].numpy(), np.stack(rows["obs"]))
    np.testing.assert_array_equal(data["action"].numpy(), rows["action"])
    np.testing.assert_array_equal(data["logp"].numpy(), rows["logp"])
    np.testing.assert_allclose(data["value"].numpy(), rows["value"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data["advantage"].numpy(), rows["adv"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(data["return"].numpy(), rows["ret"], rtol=1e-5, atol=1e-5)
    # One entry by hand: rollout 0, env 1, t=3 is truncated: r + gamma V(final obs at t=4) - V.
    a = rollouts[0].arrays
    with torch.no_grad():
        v = model.value(torch.from_numpy(a["obs"][1, 3:5])).numpy()
    index = 5 + 2  # env 0 has 5 valid steps; env 1's valid ones are t=1, 2, 3
    assert data["advantage"][index].item() == pytest.approx(
        a["reward"][1, 3] + gamma * v[1] - v[0], rel=1e-5, abs=1e-6
    )


def test_round_tensors_all_invalid_round_is_empty():
    torch.manual_seed(0)
    model = ActorCritic(OBS_DIM, NUM_ACTIONS, hidden=(8,))
    arrays = rollout_arrays(seed=0)
    arrays["valid"] = np.zeros_like(arrays["valid"])
    data = round_tensors(model, [Rollout(1, 0, arrays)], 0.9, 0.9)
    assert all(len(v) == 0 for v in data.values())
    assert data["obs"].shape == (0, OBS_DIM)


def test_round_tensors_rebuild_the_stacks_of_frame_rollouts():
    """Rollouts of each frame once (``frames [E, T + k, H, W]``, ``frame_unroll``) make the
    round of the stacks the frame-stacked envs produced across episode ends: the same samples,
    values, advantages and returns as the round of their full stacks."""
    E, T, k = 5, 8, 4
    collector = Collector(E, k)
    torch.manual_seed(0)
    model = ActorCritic(k * SHAPE[0] * SHAPE[1], 3, hidden=(8,))
    rng = np.random.default_rng(1)
    framed, stacked, valid, stacks = [], [], [], []
    for actor, actions in enumerate(scripted_actions(T, E)):
        traj = collector.collect(actions)
        arrays = {n: traj[n] for n in ("action", "reward", "terminated", "truncated", "valid")}
        arrays["logp"] = np.log(rng.uniform(0.2, 0.6, (E, T))).astype(np.float32)
        frames = frames_of(traj["obs"], traj["final_obs"])
        framed.append(Rollout(1, actor, {**arrays, "frames": frames}))
        stacked.append(
            Rollout(1, actor, {**arrays, "obs": traj["obs"], "bootstrap_obs": traj["final_obs"]})
        )
        valid.append(traj["valid"])
        stacks.append(traj["obs"][traj["valid"]])
    assert set(framed[0].arrays) == set(FRAME_UNROLL.arrays)
    data = round_tensors(model, framed, 0.9, 0.8, frames=True)
    reference = round_tensors(model, stacked, 0.9, 0.8)
    assert not np.concatenate(valid).all()  # episode ends inside the rollouts
    np.testing.assert_array_equal(data["obs"].numpy(), np.concatenate(stacks))
    assert set(data) == set(reference)
    for name, want in reference.items():
        torch.testing.assert_close(data[name], want, rtol=0, atol=0, msg=name)


def test_round_tensors_negate_across_the_turn_passes_of_both_seat_games():
    torch.manual_seed(0)
    model = ActorCritic(OBS_DIM, NUM_ACTIONS, hidden=(8,), activation="tanh")
    arrays = rollout_arrays(seed=4)
    arrays["passes"] = np.random.default_rng(4).random(arrays["reward"].shape) < 0.6
    gamma, lam = 0.9, 0.8
    data = round_tensors(model, [Rollout(3, 0, arrays)], gamma, lam)
    E, T = arrays["reward"].shape
    with torch.no_grad():
        values = model.value(torch.from_numpy(arrays["obs"].reshape(E * T, -1))).numpy()
        boot = model.value(torch.from_numpy(arrays["bootstrap_obs"])).numpy()
    common = (arrays["terminated"], arrays["truncated"], arrays["valid"], boot, gamma, lam)
    adv, _ = rollout_gae(arrays["reward"], values.reshape(E, T), *common, passes=arrays["passes"])
    plain, _ = rollout_gae(arrays["reward"], values.reshape(E, T), *common)
    valid = arrays["valid"].reshape(-1)
    np.testing.assert_allclose(data["advantage"].numpy(), adv.reshape(-1)[valid], rtol=1e-5)
    assert not np.allclose(adv, plain)  # the passes changed the advantages
