"""Replay tables: storage, eviction, sampling distributions, priorities, checkpoints."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from zrl.replay.snapshot import load_state, save_state
from zrl.replay.tables import (
    FifoQueue,
    PrioritizedTable,
    SampledBatch,
    Table,
    UniformTable,
    make_table,
)

KINDS = ["uniform", "prioritized", "fifo"]


def transitions(start: int, n: int) -> dict[str, np.ndarray]:
    """CartPole-like transitions whose fields all encode the item's global id."""
    ids = np.arange(start, start + n)
    obs = np.repeat(ids[:, None], 4, axis=1).astype(np.float32)
    return {
        "obs": obs,
        "action": ids.astype(np.int64),
        "reward": ids.astype(np.float32),
        "discount": np.full(n, 0.99, dtype=np.float32),
        "next_obs": obs + 1,
    }


def assert_items_match_keys(batch: SampledBatch) -> None:
    np.testing.assert_array_equal(batch.items["action"], batch.keys)
    np.testing.assert_array_equal(batch.items["obs"][:, 0], batch.keys.astype(np.float32))
    np.testing.assert_array_equal(batch.items["next_obs"][:, 3], batch.keys + 1)


def stored_priorities(table: PrioritizedTable) -> np.ndarray:
    return table.state_dict()["tree"]["priorities"]


# ---------------------------------------------------------------------------- storage basics
@pytest.mark.parametrize("kind", KINDS)
def test_insert_returns_monotonic_keys_and_stores_columns(kind):
    table = make_table(kind, 10)
    k1 = table.insert(transitions(0, 3))
    k2 = table.insert(transitions(3, 4))
    np.testing.assert_array_equal(k1, [0, 1, 2])
    np.testing.assert_array_equal(k2, [3, 4, 5, 6])
    assert k1.dtype == np.int64
    assert table.size == 7 and table.inserts == 7
    assert table.schema["obs"] == (np.dtype(np.float32), (4,))
    assert table.schema["action"] == (np.dtype(np.int64), ())
    batch = table.sample(5, np.random.default_rng(0))
    assert batch.items["obs"].shape == (5, 4) and batch.items["obs"].dtype == np.float32
    assert batch.items["reward"].shape == (5,)
    assert batch.keys.dtype == np.int64
    assert batch.weights.dtype == np.float32 and batch.probabilities.dtype == np.float64
    assert_items_match_keys(batch)
    assert table.samples == 5


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_eviction_overwrites_oldest(kind):
    table = make_table(kind, 5)
    for i in range(8):
        table.insert(transitions(i, 1))
    assert table.size == 5 and table.inserts == 8 and table.evicted == 3
    batch = table.sample(400, np.random.default_rng(1))
    assert set(batch.keys.tolist()) == {3, 4, 5, 6, 7}
    assert_items_match_keys(batch)


@pytest.mark.parametrize("kind", KINDS)
def test_single_insert_larger_than_capacity_keeps_last_items(kind):
    table = make_table(kind, 4)
    keys = table.insert(transitions(0, 10))
    np.testing.assert_array_equal(keys, np.arange(10))
    assert table.size == 4 and table.evicted == 6
    if kind == "fifo":
        batch = table.sample(4, np.random.default_rng(0))
        np.testing.assert_array_equal(batch.keys, [6, 7, 8, 9])
    else:
        batch = table.sample(200, np.random.default_rng(0))
        assert set(batch.keys.tolist()) == {6, 7, 8, 9}
    assert_items_match_keys(batch)


def test_big_insert_applies_priorities_of_kept_items_only():
    table = PrioritizedTable(4, alpha=1.0, epsilon=0.0)
    table.insert(transitions(0, 6), priorities=np.arange(1.0, 7.0))
    # keys 4, 5 land in slots 0, 1; keys 2, 3 in slots 2, 3
    np.testing.assert_array_equal(stored_priorities(table), [5.0, 6.0, 3.0, 4.0])


def test_sampled_items_are_copies():
    table = UniformTable(4)
    table.insert(transitions(0, 4))
    batch = table.sample(8, np.random.default_rng(0))
    batch.items["obs"][:] = -1
    assert_items_match_keys(table.sample(8, np.random.default_rng(0)))


@pytest.mark.parametrize("kind", KINDS)
def test_sample_empty_raises(kind):
    with pytest.raises(ValueError, match="empty"):
        make_table(kind, 4).sample(1, np.random.default_rng(0))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_size", [0, -1, 1.0])
def test_bad_batch_size(kind, batch_size):
    table = make_table(kind, 4)
    table.insert(transitions(0, 4))
    with pytest.raises(ValueError, match="batch_size"):
        table.sample(batch_size, np.random.default_rng(0))


# ---------------------------------------------------------------------------- schema checks
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("reward"), "reward"),
        (lambda d: d.update(extra=np.zeros(2)), "extra"),
        (lambda d: d.update(action=d["action"].astype(np.int32)), "action"),
        (lambda d: d.update(obs=np.zeros((2, 5), dtype=np.float32)), "obs"),
        (lambda d: d.update(discount=np.zeros((2, 1), dtype=np.float32)), "discount"),
    ],
    ids=["missing", "extra", "dtype", "shape", "rank"],
)
def test_schema_mismatch_names_the_field(kind, mutate, field):
    table = make_table(kind, 8)
    table.insert(transitions(0, 2))
    bad = transitions(2, 2)
    mutate(bad)
    with pytest.raises(ValueError, match=field):
        table.insert(bad)
    assert table.size == 2 and table.inserts == 2


def test_ragged_batch_and_scalars_rejected():
    table = UniformTable(8)
    bad = transitions(0, 3)
    bad["reward"] = bad["reward"][:2]
    with pytest.raises(ValueError, match="same batch length"):
        table.insert(bad)
    with pytest.raises(ValueError, match="scalar"):
        table.insert({"x": np.float32(1.0)})
    with pytest.raises(ValueError, match="non-empty dict"):
        table.insert({})


# ---------------------------------------------------------------------------- uniform
def test_uniform_sampling_is_uniform_over_live_items():
    table = UniformTable(10)
    table.insert(transitions(0, 14))  # live keys 4..13
    batch = table.sample(20_000, np.random.default_rng(3))
    counts = np.bincount(batch.keys - 4, minlength=10)
    assert counts.sum() == 20_000 and batch.keys.min() >= 4
    expected = 2000.0
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 27.9  # df = 9, p = 0.001
    np.testing.assert_array_equal(batch.weights, 1.0)
    np.testing.assert_array_equal(batch.probabilities, 0.1)
    assert table.update_priorities(batch.keys[:5], np.ones(5)) == 0


# ---------------------------------------------------------------------------- prioritized
def test_prioritized_frequencies_follow_priority_to_the_alpha():
    alpha = 0.6
    raw = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 0.0, 3.0])
    table = PrioritizedTable(8, alpha=alpha, epsilon=1e-6)
    table.insert(transitions(0, 8), priorities=raw)
    rng = np.random.default_rng(1234)
    counts = np.zeros(8)
    for _ in range(100):
        batch = table.sample(128, rng)
        counts += np.bincount(batch.keys, minlength=8)
    expected_p = (raw + 1e-6) ** alpha
    expected_p /= expected_p.sum()
    expected = expected_p * counts.sum()
    mask = expected > 5  # the zero-priority item is rarely drawn; exclude it from chi-square
    chi2 = ((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum()
    assert chi2 < 22.5, (counts, expected)  # df <= 6, p = 0.001
    assert counts[6] <= 5  # (1e-6) ** 0.6 ~ 2.5e-4 of the mass
    # Guard against a degenerate pass: uniform counts would be far off.
    uniform = np.full(8, counts.sum() / 8)
    assert ((counts[mask] - uniform[mask]) ** 2 / uniform[mask]).sum() > 1000


def test_alpha_zero_is_uniform():
    table = PrioritizedTable(4, alpha=0.0)
    table.insert(transitions(0, 4), priorities=np.array([1.0, 10.0, 100.0, 1000.0]))
    batch = table.sample(8, np.random.default_rng(0))
    np.testing.assert_allclose(batch.probabilities, 0.25)
    np.testing.assert_allclose(batch.weights, 1.0)
    # stratified: 8 segments over 4 equal masses put exactly 2 draws on each item
    np.testing.assert_array_equal(np.bincount(batch.keys, minlength=4), [2, 2, 2, 2])


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights_match_formula(beta):
    alpha, eps = 0.7, 1e-3
    raw = np.array([0.1, 0.2, 3.0, 0.0, 5.0, 1.0])
    table = PrioritizedTable(8, alpha=alpha, beta=0.4, epsilon=eps)
    table.insert(transitions(0, 6), priorities=raw)
    table.beta = beta  # annealed after construction
    batch = table.sample(32, np.random.default_rng(7))
    stored = (np.abs(raw) + eps) ** alpha
    p = stored[batch.keys] / stored.sum()
    np.testing.assert_allclose(batch.probabilities, p, rtol=1e-12)
    w = (6 * p) ** (-beta)
    np.testing.assert_allclose(batch.weights, w / w.max(), rtol=1e-6)
    assert batch.weights.max() == pytest.approx(1.0)
    if beta > 0:
        # rarer items must get larger weights
        order = np.argsort(batch.probabilities)
        assert np.all(np.diff(batch.weights[order]) <= 1e-7)
        assert batch.weights.min() < 1.0


def test_stratified_sampling_covers_every_segment():
    table = PrioritizedTable(4, alpha=1.0, epsilon=0.0)
    table.insert(transitions(0, 4), priorities=np.array([1.0, 1.0, 1.0, 1.0]))
    for seed in range(5):
        batch = table.sample(4, np.random.default_rng(seed))
        np.testing.assert_array_equal(batch.keys, [0, 1, 2, 3])


def test_update_priorities_changes_sampling_and_ignores_evicted_keys():
    table = PrioritizedTable(4, alpha=1.0, epsilon=0.0)
    table.insert(transitions(0, 6), priorities=np.ones(6))  # live keys 2..5
    before = stored_priorities(table).copy()
    applied = table.update_priorities(
        np.array([0, 1, 5, 6, 100, -1]), np.array([50.0, 60.0, 7.0, 8.0, 9.0, 10.0])
    )
    assert applied == 1
    after = stored_priorities(table)
    expected = before.copy()
    expected[5 % 4] = 7.0  # only key 5 (slot 1) changes; keys 0/1 were evicted from slots 0/1
    np.testing.assert_array_equal(after, expected)
    # evicted keys must not raise the default priority either
    assert table.max_priority == 7.0


def test_update_priorities_repeated_key_last_wins():
    table = PrioritizedTable(4, alpha=1.0, epsilon=0.0)
    table.insert(transitions(0, 4))
    assert table.update_priorities(np.array([2, 2, 2]), np.array([3.0, 9.0, 4.0])) == 3
    assert stored_priorities(table)[2] == 4.0


def test_insert_without_priorities_uses_max_seen():
    alpha, eps = 0.5, 1e-6
    table = PrioritizedTable(16, alpha=alpha, epsilon=eps)
    table.insert(transitions(0, 2))
    np.testing.assert_allclose(stored_priorities(table)[:2], (1.0 + eps) ** alpha)
    table.insert(transitions(2, 1), priorities=np.array([5.0]))
    table.insert(transitions(3, 1))
    assert stored_priorities(table)[3] == pytest.approx((5.0 + eps) ** alpha)
    table.update_priorities(np.array([0]), np.array([12.0]))
    table.insert(transitions(4, 1))
    assert stored_priorities(table)[4] == pytest.approx((12.0 + eps) ** alpha)
    # lower priorities later do not lower the max
    table.update_priorities(np.arange(5), np.full(5, 0.1))
    table.insert(transitions(5, 1))
    assert stored_priorities(table)[5] == pytest.approx((12.0 + eps) ** alpha)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -0.5])
def test_bad_priorities_rejected(bad):
    table = PrioritizedTable(8)
    table.insert(transitions(0, 2))
    with pytest.raises(ValueError, match="priorities"):
        table.insert(transitions(2, 2), priorities=np.array([1.0, bad]))
    assert table.size == 2 and table.inserts == 2  # failed insert left no trace
    with pytest.raises(ValueError, match="priorities"):
        table.update_priorities(np.array([0, 1]), np.array([bad, 1.0]))
    with pytest.raises(ValueError, match="expected 2 priorities"):
        table.insert(transitions(2, 2), priorities=np.array([1.0]))


def test_zero_priority_items_are_never_sampled_with_zero_epsilon():
    table = PrioritizedTable(8, alpha=1.0, epsilon=0.0)
    table.insert(transitions(0, 8), priorities=np.array([0, 0, 1, 0, 0, 0, 0, 0.0]))
    batch = table.sample(64, np.random.default_rng(0))
    np.testing.assert_array_equal(batch.keys, 2)


# ---------------------------------------------------------------------------- FIFO
def test_fifo_pops_in_insertion_order():
    q = FifoQueue(16)
    q.insert(transitions(0, 5))
    q.insert(transitions(5, 5))
    rng = np.random.default_rng(0)
    b1 = q.sample(4, rng)
    b2 = q.sample(4, rng)
    np.testing.assert_array_equal(b1.keys, [0, 1, 2, 3])
    np.testing.assert_array_equal(b2.keys, [4, 5, 6, 7])
    assert_items_match_keys(b2)
    assert q.size == 2 and q.samples == 8 and q.evicted == 0
    with pytest.raises(ValueError, match="holds 2 items"):
        q.sample(3, rng)
    np.testing.assert_array_equal(q.sample(2, rng).keys, [8, 9])
    with pytest.raises(ValueError, match="empty"):
        q.sample(1, rng)
    assert q.update_priorities(np.array([9]), np.array([1.0])) == 0


def test_fifo_full_evicts_oldest_and_counts_them():
    q = FifoQueue(4)
    q.insert(transitions(0, 3))
    q.sample(1, np.random.default_rng(0))  # consumes key 0, leaving 1, 2
    q.insert(transitions(3, 4))  # 6 candidates for 4 slots: keys 1, 2 evicted
    assert q.evicted == 2 and q.size == 4
    batch = q.sample(4, np.random.default_rng(0))
    np.testing.assert_array_equal(batch.keys, [3, 4, 5, 6])
    assert_items_match_keys(batch)


def test_fifo_wraps_around_many_times():
    q = FifoQueue(3)
    rng = np.random.default_rng(0)
    for i in range(0, 30, 2):
        q.insert(transitions(i, 2))
        batch = q.sample(2, rng)
        np.testing.assert_array_equal(batch.keys, [i, i + 1])
        assert_items_match_keys(batch)
    assert q.evicted == 0 and q.size == 0


def allocated_fifo(capacity: int) -> FifoQueue:
    q = FifoQueue(capacity)
    q.allocate(transitions(0, 1))
    return q


def test_fifo_passes_whole_inserts_on_without_writing_its_columns():
    """A batch of whole inserts is their arrays concatenated: one copy, the columns never
    written."""
    q = allocated_fifo(16)
    inserts = [transitions(0, 4), transitions(4, 4)]
    for items in inserts:
        q.insert(items)
    batch = q.sample(8, np.random.default_rng(0))
    np.testing.assert_array_equal(batch.keys, np.arange(8))
    assert_items_match_keys(batch)
    for name, arr in batch.items.items():
        assert not any(np.shares_memory(arr, items[name]) for items in inserts), name
        assert not q.column(name).any(), name  # the storage is as allocated: zeros
    assert q.size == 0 and q.samples == 8 and q.inserts == 8


def test_fifo_splits_an_insert_and_keeps_its_rest():
    q = allocated_fifo(16)
    q.insert(transitions(0, 5))
    rng = np.random.default_rng(0)
    first = q.sample(3, rng)
    q.insert(transitions(5, 5))
    rest = q.sample(7, rng)
    np.testing.assert_array_equal(first.keys, [0, 1, 2])
    np.testing.assert_array_equal(rest.keys, np.arange(3, 10))
    assert_items_match_keys(first)
    assert_items_match_keys(rest)
    assert q.size == 0


def test_fifo_held_inserts_reach_the_columns_when_they_are_read():
    """Eviction, gather and snapshots see the held items as the ring holds them."""
    q = allocated_fifo(4)
    q.insert(transitions(0, 3))
    q.insert(transitions(3, 3))  # 6 for 4 slots: the ring's way, keys 0 and 1 evicted
    assert q.evicted == 2 and q.size == 4
    q.sample(1, np.random.default_rng(0))  # key 2, out of the columns
    q.insert(transitions(6, 1))  # held again
    np.testing.assert_array_equal(q.gather(np.arange(3, 7))["action"], np.arange(3, 7))
    q.insert(transitions(7, 1))  # full: key 3 evicted
    restored = FifoQueue(4)
    restored.load_state_dict(q.state_dict())
    for table in (q, restored):
        batch = table.sample(4, np.random.default_rng(0))
        np.testing.assert_array_equal(batch.keys, np.arange(4, 8))
        assert_items_match_keys(batch)


# ---------------------------------------------------------------------------- checkpoints
def build(kind: str) -> Table:
    table = make_table(kind, 16)
    rng = np.random.default_rng(5)
    for i in range(0, 40, 8):
        table.insert(transitions(i, 8), priorities=rng.random(8) * 3)
        if kind != "fifo":
            b = table.sample(4, rng)
            table.update_priorities(b.keys, rng.random(4))
    if kind == "fifo":
        table.sample(3, rng)
    return table


def assert_batches_equal(a: SampledBatch, b: SampledBatch) -> None:
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert a.items.keys() == b.items.keys()
    for name in a.items:
        np.testing.assert_array_equal(a.items[name], b.items[name])


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trip_is_exact(kind):
    table = build(kind)
    if isinstance(table, PrioritizedTable):
        table.beta = 0.77
    state = pickle.loads(pickle.dumps(table.state_dict()))
    restored = make_table(kind, 16)
    restored.load_state_dict(state)
    for attr in ("size", "inserts", "samples", "evicted"):
        assert getattr(restored, attr) == getattr(table, attr), attr
    if isinstance(table, PrioritizedTable):
        assert isinstance(restored, PrioritizedTable)
        assert restored.beta == 0.77 and restored.max_priority == table.max_priority
        np.testing.assert_array_equal(stored_priorities(restored), stored_priorities(table))
    for seed in range(3):
        n = 4 if kind == "fifo" else 64
        assert_batches_equal(
            table.sample(n, np.random.default_rng(seed)),
            restored.sample(n, np.random.default_rng(seed)),
        )
    # subsequent inserts keep getting the same keys in both
    np.testing.assert_array_equal(
        table.insert(transitions(100, 3)), restored.insert(transitions(100, 3))
    )


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_is_a_snapshot(kind):
    table = build(kind)
    state = table.state_dict()
    size, inserts = table.size, table.inserts
    table.insert(transitions(500, 16))
    restored = make_table(kind, 16)
    restored.load_state_dict(state)
    assert restored.size == size and restored.inserts == inserts
    assert 500 not in restored.sample(4, np.random.default_rng(0)).items["action"]


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_without_copies_is_views_of_the_same_rows(kind):
    """``copy=False`` (a replay shard writing its snapshot while it holds the table still):
    the same state, its arrays views of the table's storage, not copies."""
    table = build(kind)
    copied, viewed = table.state_dict(), table.state_dict(copy=False)
    if isinstance(table, PrioritizedTable):
        np.testing.assert_array_equal(viewed["tree"]["priorities"], copied["tree"]["priorities"])
        assert not np.shares_memory(copied["tree"]["priorities"], table._tree._tree)
        assert np.shares_memory(viewed["tree"]["priorities"], table._tree._tree)
    for name, column in table._columns.items():
        np.testing.assert_array_equal(viewed["columns"][name], copied["columns"][name])
        assert np.shares_memory(viewed["columns"][name], column), name
        assert not np.shares_memory(copied["columns"][name], column), name
    restored = make_table(kind, 16)
    restored.load_state_dict(viewed)
    assert (restored.size, restored.inserts) == (table.size, table.inserts)


@pytest.mark.parametrize("kind", KINDS)
def test_a_snapshot_of_a_table_still_filling_holds_only_its_written_rows(kind, tmp_path):
    """A 1M-transition table 66k transitions in wrote 888 MB every checkpoint: now the state
    holds the rows written so far (slot key % capacity), the file shrinks with them, and it
    restores the table exactly, as does a state written whole (the earlier format)."""
    table = make_table(kind, 1000)
    table.insert(transitions(0, 30), priorities=np.arange(1.0, 31.0))
    state = table.state_dict()
    assert {col.shape[0] for col in state["columns"].values()} == {30}
    save_state(tmp_path / "part.npz", state)
    whole = {  # the earlier format: every column written whole, unwritten rows zeros
        **state,
        "columns": {
            k: np.concatenate([v, np.zeros((970, *v.shape[1:]), v.dtype)])
            for k, v in state["columns"].items()
        },
    }
    save_state(tmp_path / "whole.npz", whole)
    assert (tmp_path / "part.npz").stat().st_size * 3 < (tmp_path / "whole.npz").stat().st_size
    for path in ("part.npz", "whole.npz"):
        restored = make_table(kind, 1000)
        restored.load_state_dict(load_state(tmp_path / path))
        assert (restored.size, restored.inserts) == (table.size, table.inserts)
        for name in state["columns"]:
            np.testing.assert_array_equal(restored.column(name), table.column(name))
        n = 4 if kind == "fifo" else 16
        assert_batches_equal(
            table.sample(n, np.random.default_rng(1)), restored.sample(n, np.random.default_rng(1))
        )
        table.load_state_dict(state)  # undo the FIFO's consuming sample
    wrapped = make_table(kind, 16)
    wrapped.insert(transitions(0, 40))  # past capacity: every row written
    assert {c.shape[0] for c in wrapped.state_dict()["columns"].values()} == {16}
    short = {**state, "columns": {k: v[:29] for k, v in state["columns"].items()}}
    with pytest.raises(ValueError, match=r"state column .* 30 or 1000 rows expected"):
        make_table(kind, 1000).load_state_dict(short)


def test_state_dict_of_empty_table_round_trips():
    table = PrioritizedTable(8)
    restored = PrioritizedTable(8)
    restored.load_state_dict(table.state_dict())
    assert restored.size == 0
    restored.insert(transitions(0, 2))
    assert restored.sample(2, np.random.default_rng(0)).keys.tolist() == [0, 1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_column_an_old_state_lacks_is_filled_and_new_items_carry_theirs(kind):
    """A table from before items kept their weights version (a snapshot of zrl < 0.3, say)
    takes the items that now carry one: the old items hold the fill value."""
    old = build(kind)
    table = make_table(kind, 16)
    table.load_state_dict(old.state_dict())
    assert table.fill_missing_column("weights_version", -1, np.int64)
    assert not table.fill_missing_column("weights_version", -2, np.int64)  # it has it now
    assert table.schema["weights_version"] == (np.dtype(np.int64), ())
    first_new = table.inserts
    table.insert({**transitions(100, 3), "weights_version": np.full(3, 7, np.int64)})
    batch = table.sample(table.size if kind == "fifo" else 64, np.random.default_rng(0))
    np.testing.assert_array_equal(
        batch.items["weights_version"], np.where(batch.keys >= first_new, 7, -1)
    )
    assert not make_table(kind, 16).fill_missing_column("weights_version", -1, np.int64)


def test_load_state_dict_rejects_other_kind_or_capacity():
    state = build("uniform").state_dict()
    with pytest.raises(ValueError, match="'uniform'"):
        make_table("fifo", 16).load_state_dict(state)
    with pytest.raises(ValueError, match="capacity 16"):
        make_table("uniform", 32).load_state_dict(state)


# ---------------------------------------------------------------------------- construction
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("capacity", [0, -5, 3.5, True, None])
def test_bad_capacity(kind, capacity):
    with pytest.raises(ValueError, match=f"capacity.*{capacity}"):
        make_table(kind, capacity)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"beta": float("inf")}, "beta"),
        ({"epsilon": -1e-3}, "epsilon"),
    ],
)
def test_bad_prioritized_args(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PrioritizedTable(8, **kwargs)


def test_make_table():
    assert type(make_table("uniform", 4)) is UniformTable
    assert type(make_table("fifo", 4)) is FifoQueue
    t = make_table("prioritized", 4, alpha=0.9, beta=0.5)
    assert isinstance(t, PrioritizedTable) and t.alpha == 0.9 and t.beta == 0.5
    with pytest.raises(ValueError, match=r"'lifo'.*\['fifo', 'prioritized', 'uniform'\]"):
        make_table("lifo", 4)
