"""SumTree against a brute-force cumsum/searchsorted reference."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.replay.sumtree import SumTree

SETTINGS = settings(max_examples=150, deadline=None)


def reference_find(leaves: np.ndarray, values: np.ndarray) -> np.ndarray:
    """First leaf whose cumulative sum exceeds the value, clamped to the last nonzero leaf."""
    cum = np.cumsum(leaves)
    idx = np.searchsorted(cum, values, side="right")
    last_nonzero = int(np.flatnonzero(leaves)[-1])
    return np.minimum(idx, last_nonzero)


@st.composite
def update_sequences(draw, exact: bool):
    """A capacity plus a list of (indices, priorities) batches, with repeated indices."""
    capacity = draw(st.integers(1, 300))
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 40))
        idx = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
        if exact:
            # Multiples of 1/4 below 2**10: every partial sum is exact in float64, so the
            # tree must agree with the reference bit for bit, boundaries included.
            pri = [k / 4 for k in draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))]
        else:
            pri = draw(
                st.lists(
                    st.one_of(st.just(0.0), st.floats(1e-8, 1e6, allow_nan=False)),
                    min_size=n,
                    max_size=n,
                )
            )
        batches.append((np.array(idx, dtype=np.int64), np.array(pri, dtype=np.float64)))
    return capacity, batches


def apply_sequentially(capacity: int, batches) -> np.ndarray:
    leaves = np.zeros(capacity)
    for idx, pri in batches:
        for i, p in zip(idx, pri, strict=True):  # sequential: last write wins
            leaves[i] = p
    return leaves


@SETTINGS
@given(update_sequences(exact=True), st.lists(st.floats(0, 1, exclude_max=True), max_size=30))
def test_matches_reference_exactly_on_dyadic_priorities(seq, fractions):
    capacity, batches = seq
    tree = SumTree(capacity)
    for idx, pri in batches:
        tree.update(idx, pri)
    leaves = apply_sequentially(capacity, batches)

    np.testing.assert_array_equal(tree.get(np.arange(capacity)), leaves)
    assert tree.total() == leaves.sum()
    if leaves.sum() == 0:
        with pytest.raises(ValueError, match="total"):
            tree.find(np.array([0.0]))
        return

    total = leaves.sum()
    cum = np.cumsum(leaves)
    prefixes = cum - leaves  # start of each leaf's interval; exact with dyadic values
    edges = [0.0, np.nextafter(total, 0.0), *prefixes[leaves > 0]]
    values = np.array([f * total for f in fractions] + edges)
    found = tree.find(values)
    np.testing.assert_array_equal(found, reference_find(leaves, values))
    assert np.all(leaves[found] > 0)


@SETTINGS
@given(update_sequences(exact=False), st.lists(st.floats(0, 1, exclude_max=True), max_size=30))
def test_general_floats_land_in_the_right_interval(seq, fractions):
    capacity, batches = seq
    tree = SumTree(capacity)
    for idx, pri in batches:
        tree.update(idx, pri)
    leaves = apply_sequentially(capacity, batches)
    total = leaves.sum()
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), leaves)
    assert tree.total() == pytest.approx(total, rel=1e-12)
    if total == 0:
        return

    values = np.array([f * tree.total() for f in fractions])
    found = tree.find(values)
    assert np.all(leaves[found] > 0)
    cum = np.cumsum(leaves)
    tol = 1e-9 * total
    assert np.all(cum[found] - leaves[found] - tol <= values)
    assert np.all(values < cum[found] + tol)

    # At and beyond the right edge the result must be the last nonzero leaf, never a
    # zero-priority one; below zero it must be the first nonzero leaf.
    nz = np.flatnonzero(leaves)
    t = tree.total()
    right = tree.find(np.array([t, np.nextafter(t, np.inf), 2 * t + 1]))
    assert np.all(leaves[right] > 0)
    np.testing.assert_array_equal(right, nz[-1])
    assert tree.find(np.array([-1.0]))[0] == nz[0]


def test_repeated_index_last_value_wins():
    tree = SumTree(8)
    tree.update(np.array([3, 5, 3, 3, 5]), np.array([1.0, 2.0, 7.0, 4.0, 9.0]))
    np.testing.assert_array_equal(tree.get(np.array([3, 5])), [4.0, 9.0])
    assert tree.total() == 13.0


def test_scalar_priority_broadcasts():
    tree = SumTree(4)
    tree.update(np.array([0, 2]), np.array(2.5))
    np.testing.assert_array_equal(tree.get(np.arange(4)), [2.5, 0, 2.5, 0])


def test_right_edge_rounding_never_returns_empty_leaf():
    # 1e16 + 1 rounds to 1e16, so the root equals its left-left grandchild and a value equal
    # to the total would walk into the empty right half if the descent trusted v >= left.
    tree = SumTree(4)
    tree.update(np.array([0, 1]), np.array([1e16, 1.0]))
    found = tree.find(np.array([tree.total(), np.nextafter(tree.total(), 0.0)]))
    assert set(found.tolist()) <= {0, 1}
    assert np.all(tree.get(found) > 0)


def test_zero_priority_leaves_are_skipped():
    tree = SumTree(5)
    tree.update(np.arange(5), np.array([0.0, 1.0, 0.0, 0.0, 1.0]))
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.5, 1.0, 1.5, 1.999])), [1, 1, 4, 4, 4])


def test_padding_leaves_are_never_returned():
    tree = SumTree(5)  # padded to 8 leaves
    tree.update(np.arange(5), np.ones(5))
    assert tree.find(np.array([4.999999, 5.0, 100.0])).max() == 4


@pytest.mark.parametrize(
    "priorities", [[-1.0], [np.nan], [np.inf], [-np.inf]], ids=["neg", "nan", "inf", "-inf"]
)
def test_bad_priorities_raise_and_leave_tree_unchanged(priorities):
    tree = SumTree(4)
    tree.update(np.array([1]), np.array([2.0]))
    with pytest.raises(ValueError, match="priorities"):
        tree.update(np.array([0]), np.array(priorities))
    assert tree.total() == 2.0


@pytest.mark.parametrize("index", [-1, 4, 100])
def test_out_of_range_index_raises(index):
    tree = SumTree(4)
    with pytest.raises(ValueError, match=str(index)):
        tree.update(np.array([index]), np.array([1.0]))
    with pytest.raises(ValueError, match=str(index)):
        tree.get(np.array([index]))


def test_length_mismatch_and_float_indices_raise():
    tree = SumTree(4)
    with pytest.raises(ValueError, match="same length"):
        tree.update(np.array([0, 1]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="integers"):
        tree.update(np.array([0.5]), np.array([1.0]))


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "8"])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SumTree(capacity)


def test_find_on_empty_tree_raises():
    with pytest.raises(ValueError, match="total 0"):
        SumTree(4).find(np.array([0.0]))


def test_capacity_one():
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([3.0]))
    assert tree.total() == 3.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 2.9, 3.0])), [0, 0, 0])


@SETTINGS
@given(update_sequences(exact=False))
def test_state_dict_round_trip_is_bitwise(seq):
    capacity, batches = seq
    tree = SumTree(capacity)
    for idx, pri in batches:
        tree.update(idx, pri)
    state = pickle.loads(pickle.dumps(tree.state_dict()))
    other = SumTree(capacity)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other._tree, tree._tree)
    assert other.total() == tree.total()


def test_load_state_dict_checks_capacity():
    state = SumTree(4).state_dict()
    with pytest.raises(ValueError, match="capacity 4"):
        SumTree(8).load_state_dict(state)


def test_large_capacity_is_fast():
    """Generous bound (targets are < 0.5 ms each) so a loaded CI box does not flake."""
    capacity = 2**21
    tree = SumTree(capacity)
    rng = np.random.default_rng(0)
    tree.update(np.arange(capacity), rng.random(capacity))
    idx = rng.integers(0, capacity, 256)
    pri = rng.random(256)
    values = rng.random(256) * tree.total()
    best_update = best_find = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        tree.update(idx, pri)
        t1 = time.perf_counter()
        tree.find(values)
        t2 = time.perf_counter()
        best_update, best_find = min(best_update, t1 - t0), min(best_find, t2 - t1)
    assert best_update < 2e-3, best_update
    assert best_find < 2e-3, best_find
