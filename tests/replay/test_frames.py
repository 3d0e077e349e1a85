"""FrameTable: frame-stacked observations stored once, rebuilt bit for bit.

The reference is what the existing pipeline makes of full stacks: a real gymnasium vector
env (NEXT_STEP autoreset, ``FrameStackObservation``) stepped the way ``Actor.collect`` does,
its stacks sent as a ``transitions`` TRAJECTORY and cut by ``assemble_transitions``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers.frames import SHAPE, Collector, scripted_actions
from zrl.codecs.frames import frames_of
from zrl.codecs.nstep import nstep_transitions
from zrl.replay.assemble import assemble_transitions
from zrl.replay.frames import FrameTable, assemble_frame_transitions, bytes_per_transition
from zrl.replay.snapshot import load_state, save_state
from zrl.replay.tables import make_table
from zrl.transport import messages as M
from zrl.transport import protocol as P

GAMMA = 0.9


STEP_KEYS = ("action", "reward", "terminated", "truncated", "valid", "priority")


def reference(traj: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """``assemble_transitions`` of the full stacks, plus each transition's lowest needed row
    position: the oldest row frame its obs stack shows that is not padding added at a reset
    inside the row (frames[e, i:i+k] is obs_i with the frames before its episode zeroed)."""
    E, T, k = traj["obs"].shape[:3]
    flat = {name: traj[name] for name in STEP_KEYS}
    flat["obs"] = traj["obs"].reshape(E, T, -1).astype(np.float32)
    flat["next_obs"] = traj["next_obs"].reshape(E, T, -1).astype(np.float32)
    items, priorities = assemble_transitions(P.Message(P.TRAJECTORY, arrays=flat), n, GAMMA)
    ns = nstep_transitions(
        *(traj[x] for x in ("reward", "terminated", "truncated", "valid")), n, GAMMA
    )
    age = traj["obs"][ns.env, ns.start, -1, 0, 0].astype(np.int64) - 1
    reset_obs = ns.start - age  # obs index of the episode's reset obs
    row_pos = np.where(reset_obs >= 1, np.maximum(ns.start, k - 1 + reset_obs), ns.start)
    return {**items, "priority": priorities, "needed": ns.env * (T + k) + row_pos}


def insert(table: FrameTable, traj: dict[str, np.ndarray], n: int) -> np.ndarray:
    return insert_with_priorities(table, traj, n)[0]


def insert_with_priorities(
    table: FrameTable, traj: dict[str, np.ndarray], n: int
) -> tuple[np.ndarray, np.ndarray]:
    frames = frames_of(traj["obs"], traj["final_obs"])
    items, priorities = assemble_frame_transitions(
        frames, *(traj[name] for name in STEP_KEYS), n_step=n, gamma=GAMMA
    )
    return table.insert_trajectory(frames, items, priorities), priorities


class Run:
    """Feeds trajectories to a table and keeps the reference of every key."""

    def __init__(self, table: FrameTable, collector: Collector, n: int = 3) -> None:
        self.table, self.collector, self.n = table, collector, n
        self.ref: dict[str, list[np.ndarray]] = {}
        self.frames = 0

    def add(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        traj = self.collector.collect(actions)
        ref = reference(traj, self.n)
        keys, priorities = insert_with_priorities(self.table, traj, self.n)
        np.testing.assert_array_equal(priorities, ref["priority"])
        np.testing.assert_array_equal(
            keys, np.arange(self.table.inserts - len(keys), self.table.inserts)
        )
        ref["needed"] = ref["needed"] + self.frames
        self.frames += traj["obs"].shape[0] * (traj["obs"].shape[1] + traj["obs"].shape[2])
        for name, value in ref.items():
            self.ref.setdefault(name, []).append(value)
        return traj

    def expected(self, name: str, keys: np.ndarray) -> np.ndarray:
        return np.concatenate(self.ref[name])[keys]

    def live_keys(self) -> np.ndarray:
        """The last ``capacity`` keys, less those needing frames the ring no longer holds."""
        oldest = max(0, self.frames - self.table.frame_capacity)
        live = np.flatnonzero(np.concatenate(self.ref["needed"]) >= oldest)
        return live[live >= self.table.inserts - self.table.capacity]

    def check(self, keys: np.ndarray, items: dict[str, np.ndarray]) -> None:
        B = len(keys)
        k = self.table.stack
        for name in ("obs", "next_obs"):
            assert items[name].dtype == np.uint8 and items[name].shape == (B, k, *SHAPE)
            np.testing.assert_array_equal(
                items[name].reshape(B, -1).astype(np.float32), self.expected(name, keys)
            )
        for name in ("action", "reward", "discount"):
            assert items[name].dtype == self.expected(name, keys).dtype
            np.testing.assert_array_equal(items[name], self.expected(name, keys))
        assert set(items) == {"obs", "action", "reward", "discount", "next_obs"}


def uniform_table(k: int, frames: int = 10_000, capacity: int = 10_000, padding="zero"):
    return FrameTable(make_table("uniform", capacity), frames, SHAPE, k, padding)


# ---------------------------------------------------------------------------- wire format
def test_frames_of_layout():
    rng = np.random.default_rng(0)
    E, T, k = 2, 5, 4
    stream = rng.integers(1, 256, (E, T + k, *SHAPE), dtype=np.uint8)  # one long episode
    obs = np.stack([stream[:, i : i + k] for i in range(T + 1)], axis=1)  # obs_0..obs_T
    frames = frames_of(obs[:, :T], obs[:, T])
    assert frames.shape == (E, T + k, *SHAPE) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, stream)
    np.testing.assert_array_equal(frames[:, : k - 1], obs[:, 0, :-1])
    for i in range(T + 1):
        np.testing.assert_array_equal(frames[:, k - 1 + i], obs[:, i, -1])


# ---------------------------------------------------------------------------- exact rebuild
@pytest.mark.parametrize("padding", ["zero", "reset"])
def test_scripted_episode_ends_rebuild_exact_stacks(padding):
    T, E, k = 8, 5, 4
    run = Run(uniform_table(k, padding=padding), Collector(E, k, padding))
    trajs = [run.add(a) for a in scripted_actions(T, E)]
    # The schedule does what it says: invalid first steps, a reset obs as the final obs.
    assert not trajs[1]["valid"][0, 0] and not trajs[1]["valid"][2, 0]
    assert not trajs[0]["valid"][4, T - 1] and trajs[0]["final_obs"][4, -1, 0, 0] == 1
    assert trajs[0]["truncated"][2, T - 1] and trajs[0]["terminated"][0, 0]
    if padding == "zero":
        assert np.all(trajs[1]["obs"][1, 3, :-1] == 0)  # the one-step episode's reset obs
    table = run.table
    keys = np.arange(table.inserts)
    assert table.size == len(keys) == sum(int(t["valid"].sum()) for t in trajs)
    run.check(keys, table.lookup(keys))
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(20):
        batch = table.sample(64, rng)
        run.check(batch.keys, batch.items)
        seen |= set(batch.keys.tolist())
    assert seen == set(keys.tolist())


@pytest.mark.parametrize(
    "k,n,padding",
    [(1, 1, "zero"), (2, 3, "reset"), (4, 1, "zero"), (4, 3, "zero"), (4, 5, "reset")],
)
def test_random_episode_ends_rebuild_exact_stacks(k, n, padding):
    E, T = 3, 7
    rng = np.random.default_rng(k * 10 + n)
    run = Run(uniform_table(k, padding=padding), Collector(E, k, padding, seed=n), n=n)
    for _ in range(6):
        run.add(rng.choice(3, size=(T, E), p=[0.7, 0.18, 0.12]))
    keys = np.arange(run.table.inserts)
    assert len(keys) > 20
    run.check(keys, run.table.lookup(keys))
    batch = run.table.sample(200, rng)
    run.check(batch.keys, batch.items)


def test_no_valid_steps_inserts_nothing_but_frames():
    E, T, k = 2, 3, 4
    table = uniform_table(k)
    frames = np.ones((E, T + k, *SHAPE), np.uint8)
    zeros = np.zeros((E, T))
    items, pri = assemble_frame_transitions(
        frames, zeros.astype(np.int64), zeros, zeros, zeros, zeros, zeros, 3, GAMMA
    )
    assert len(pri) == 0
    assert len(table.insert_trajectory(frames, items, pri)) == 0
    assert table.size == 0 and table.frame_inserts == E * (T + k)


# ---------------------------------------------------------------------------- eviction
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("capacity", [10_000, 41, 37])  # frames bind / both do, in turns
def test_ring_wrap_evicts_exactly_transitions_reading_overwritten_frames(kind, capacity):
    E, T, k = 3, 6, 4
    row = E * (T + k)
    table = FrameTable(make_table(kind, capacity), int(2.5 * row), SHAPE, k)
    run = Run(table, Collector(E, k, seed=3))
    rng = np.random.default_rng(5)
    frame_evictions = 0
    for i in range(12):
        size_before, inserts_before = table.size, table.inserts
        run.add(rng.choice(3, size=(T, E), p=[0.8, 0.12, 0.08]))
        live = run.live_keys()
        assert table.size == len(live) and table.evicted == table.inserts - len(live)
        # More left than the inner ring's own overwrite explains: the frame ring evicted.
        overwrite = max(0, size_before + table.inserts - inserts_before - capacity)
        frame_evictions += size_before + table.inserts - inserts_before - table.size > overwrite
        run.check(live, table.lookup(live))
        if i >= 3:
            assert live[0] > 0  # the ring has wrapped and evicted
            with pytest.raises(ValueError, match="not live"):
                table.lookup(live[:1] - 1)
        batch = table.sample(256, rng)
        assert set(batch.keys.tolist()) <= set(live.tolist())
        run.check(batch.keys, batch.items)
    assert frame_evictions >= 3


def test_evict_oldest_on_plain_tables():
    for kind in ("uniform", "prioritized", "fifo"):
        table = make_table(kind, 8)
        table.insert({"x": np.arange(12)})  # keys 4..11 live
        assert table.evict_oldest(3) == 3
        assert table.size == 5 and table.evicted == 7
        assert table.evict_oldest(100) == 5 and table.size == 0 and table.evicted == 12
        table.insert({"x": np.arange(12, 16)})
        table.evict_oldest(2)
        batch = table.sample(2 if kind == "fifo" else 200, np.random.default_rng(0))
        assert set(batch.keys.tolist()) == {14, 15}
        np.testing.assert_array_equal(batch.items["x"], batch.keys)
        with pytest.raises(ValueError):
            table.evict_oldest(-1)


def test_prioritized_sampling_and_dropped_updates_of_evicted_keys():
    E, T, k = 2, 6, 4
    row = E * (T + k)
    table = FrameTable(make_table("prioritized", 10_000, alpha=1.0, beta=1.0), 2 * row, SHAPE, k)
    run = Run(table, Collector(E, k, seed=7))
    rng = np.random.default_rng(2)
    for _ in range(5):
        run.add(rng.choice(3, size=(T, E), p=[0.9, 0.1, 0.0]))
    live = run.live_keys()
    evicted = np.setdiff1d(np.arange(table.inserts), live)
    assert len(evicted) > 0 and table.size == len(live)
    applied = table.update_priorities(np.concatenate([evicted, live]), np.full(table.inserts, 50.0))
    assert applied == len(live)
    target = live[len(live) // 2]
    assert table.update_priorities(np.array([target]), np.array([1e6])) == 1
    batch = table.sample(512, rng)
    assert set(batch.keys.tolist()) <= set(live.tolist())
    assert np.mean(batch.keys == target) > 0.9
    run.check(batch.keys, batch.items)
    assert batch.weights.dtype == np.float32 and batch.probabilities.shape == (512,)
    # Initial priorities come from the trajectory: proportional sampling (alpha 1) follows them.
    fresh = FrameTable(make_table("prioritized", 1000, alpha=1.0), 1000, SHAPE, k)
    traj = Collector(E, k, seed=8).collect(np.zeros((T, E), np.int64))
    traj["priority"][:] = 0.0
    traj["priority"][1, 2] = 1.0
    keys = insert(fresh, traj, 3)
    batch = fresh.sample(64, rng)
    np.testing.assert_array_equal(batch.keys, keys[T + 2])  # row-major: env 1, step 2


# ---------------------------------------------------------------------------- snapshots
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_state_dict_round_trip_samples_identically(kind, tmp_path):
    E, T, k = 2, 5, 4
    table = FrameTable(make_table(kind, 40), 3 * E * (T + k), SHAPE, k, "reset")
    collector = Collector(E, k, "reset", seed=4)
    rng = np.random.default_rng(0)
    for _ in range(6):
        insert(table, collector.collect(rng.choice(3, size=(T, E), p=[0.8, 0.1, 0.1])), 3)
    table.update_priorities(np.arange(table.inserts), rng.random(table.inserts))
    save_state(tmp_path / "s.npz", {"table": table.state_dict()})
    copy = FrameTable.from_state_dict(load_state(tmp_path / "s.npz")["table"])
    assert repr(copy) == repr(table)
    for _ in range(2):
        a, b = table.sample(32, np.random.default_rng(9)), copy.sample(32, np.random.default_rng(9))
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.weights, b.weights)
        for name in a.items:
            np.testing.assert_array_equal(a.items[name], b.items[name])
        traj = collector.collect(rng.choice(3, size=(T, E)))
        np.testing.assert_array_equal(insert(table, traj, 3), insert(copy, traj, 3))
    other = FrameTable(make_table(kind, 40), 3 * E * (T + k), SHAPE, k, "zero")
    with pytest.raises(ValueError, match="state is for"):
        other.load_state_dict(table.state_dict())


def test_a_snapshot_holds_the_frames_written_so_far_and_an_earlier_whole_one_loads():
    E, T, k = 2, 5, 4
    table = FrameTable(make_table("uniform", 400), 20 * E * (T + k), SHAPE, k, "reset")
    collector = Collector(E, k, "reset", seed=2)
    rng = np.random.default_rng(0)
    insert(table, collector.collect(rng.choice(3, size=(T, E))), 3)
    state = table.state_dict()
    assert state["frames"].shape[0] == table.frame_inserts < table.frame_capacity
    viewed = table.state_dict(copy=False)  # views of the ring, for a shard holding it still
    np.testing.assert_array_equal(viewed["frames"], state["frames"])
    assert np.shares_memory(viewed["frames"], table._frames)
    assert not np.shares_memory(state["frames"], table._frames)
    whole = dict(state)
    whole["frames"] = np.zeros((table.frame_capacity, *SHAPE), np.uint8)
    whole["frames"][: table.frame_inserts] = state["frames"]
    for saved in (state, whole):
        copy = FrameTable.from_state_dict(saved)
        a, b = table.sample(16, np.random.default_rng(3)), copy.sample(16, np.random.default_rng(3))
        for name in a.items:
            np.testing.assert_array_equal(a.items[name], b.items[name])
    with pytest.raises(ValueError, match="state frames"):
        FrameTable.from_state_dict({**state, "frames": state["frames"][:-1]})


def test_weights_versions_pass_through_and_an_old_state_holds_unknown_ones():
    """Items keep the weights version the shard stamps on them (``weights_version`` comes out
    of ``sample`` beside the rebuilt stacks); a state from before items had one loads, and
    its items read ``UNKNOWN_VERSION``."""
    E, T, k = 2, 5, 4
    table = FrameTable(make_table("prioritized", 40), 3 * E * (T + k), SHAPE, k, "zero")
    collector = Collector(E, k, "zero", seed=1)
    rng = np.random.default_rng(0)
    insert(table, collector.collect(rng.choice(3, size=(T, E))), 3)  # no version column
    restored = FrameTable.from_state_dict(table.state_dict())
    assert restored.table.fill_missing_column("weights_version", M.UNKNOWN_VERSION, np.int64)
    first_new = restored.inserts
    traj = collector.collect(rng.choice(3, size=(T, E)))
    frames = frames_of(traj["obs"], traj["final_obs"])
    items, priorities = assemble_frame_transitions(
        frames, *(traj[name] for name in STEP_KEYS), n_step=3, gamma=GAMMA
    )
    items["weights_version"] = np.full(len(priorities), 7, np.int64)
    restored.insert_trajectory(frames, items, priorities)
    batch = restored.sample(64, rng)
    assert set(batch.items) == {
        "obs",
        "action",
        "reward",
        "discount",
        "next_obs",
        "weights_version",
    }
    np.testing.assert_array_equal(
        batch.items["weights_version"], np.where(batch.keys >= first_new, 7, M.UNKNOWN_VERSION)
    )
    assert (batch.keys < first_new).any() and (batch.keys >= first_new).any()


# ---------------------------------------------------------------------------- memory
def test_memory_per_transition_is_about_one_frame():
    E, T, k, shape = 4, 16, 4, (84, 84)
    frame_bytes = math.prod(shape)
    per_item = bytes_per_transition(shape, k, T)
    assert per_item == frame_bytes * (T + k) / T + 64  # 48 bytes of item, 16 of key/priority
    budget = int(200 * per_item)
    table = FrameTable.for_budget("prioritized", 10_000, budget, shape, k, T, num_envs=E)
    assert table.capacity == 200 and table.nbytes <= budget + 2048  # + sum tree padding
    rng = np.random.default_rng(0)
    steps = np.zeros((E, T), np.float32)
    for _ in range(8):
        frames = rng.integers(0, 256, (E, T + k, *shape), dtype=np.uint8)
        items, pri = assemble_frame_transitions(
            frames, steps.astype(np.int64), steps, steps, steps, steps == 0, steps, 3, GAMMA
        )
        table.insert_trajectory(frames, items, pri)
    assert table.size >= 0.9 * table.capacity
    measured = table.nbytes / table.capacity
    assert measured <= 1.3 * frame_bytes  # T + k frames per T transitions, plus ~56 bytes
    assert measured < 2 * k * frame_bytes / 6  # vs obs + next_obs stacks
    # Pong, 84x84, k=4, T=32: 1M transitions in about 8 GB instead of 56 GB of uint8 stacks.
    assert 7.0e9 < 1_000_000 * bytes_per_transition((84, 84), 4, 32) < 8.1e9
    assert FrameTable.for_budget("uniform", 50, None, shape, k, T).capacity == 50
    assert FrameTable.for_budget("uniform", 50, 10**9, shape, k, T).capacity == 50
    with pytest.raises(ValueError, match="cannot hold one trajectory"):
        FrameTable.for_budget("uniform", 50, 10 * frame_bytes, shape, k, T, num_envs=E)


# ---------------------------------------------------------------------------- rejects
def test_rejected_inserts_change_nothing():
    E, T, k = 2, 4, 4
    table = FrameTable(make_table("prioritized", 100), E * (T + k), SHAPE, k)
    traj = Collector(E, k).collect(np.zeros((T, E), np.int64))
    frames = frames_of(traj["obs"], traj["final_obs"])
    items, pri = assemble_frame_transitions(frames, *(traj[x] for x in STEP_KEYS), 3, GAMMA)
    before = repr(table)
    bad = [
        (frames.astype(np.float32), items, pri),
        (frames[:, :, :-1], items, pri),
        (np.concatenate([frames, frames]), items, pri),  # more frames than the ring
        (frames, items, -pri),
        (frames, {**items, "next_frame": items["next_frame"] + 100}, pri),
        (frames, {name: v for name, v in items.items() if name != "first_frame"}, pri),
        (frames, {name: v[::-1] for name, v in items.items()}, pri[::-1]),  # not in order
    ]
    for args in bad:
        with pytest.raises(ValueError):
            table.insert_trajectory(*args)
        assert repr(table) == before and table.frame_inserts == 0
    with pytest.raises(ValueError, match="non-finite or negative"):
        steps = [traj[x] for x in STEP_KEYS[:-1]]
        assemble_frame_transitions(frames, *steps, -np.ones((E, T), np.float32), 3, GAMMA)
    steps = [traj[x] for x in STEP_KEYS]
    assemble_frame_transitions(frames, *steps, 3, GAMMA, stack=k)
    with pytest.raises(ValueError, match="k = 2"):
        assemble_frame_transitions(frames, *steps, 3, GAMMA, stack=2)
    with pytest.raises(ValueError, match="k >= 1"):
        assemble_frame_transitions(frames[:, :T], *steps, 3, GAMMA)
    with pytest.raises(ValueError, match="uniform or prioritized"):
        FrameTable(make_table("fifo", 10), 100, SHAPE, k)
