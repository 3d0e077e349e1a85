"""Array-backed binary sum tree for proportional prioritized replay.

The tree lives in one flat float64 array of length ``2 * leaves`` where ``leaves`` is
``capacity`` rounded up to a power of two: node ``1`` is the root, node ``k`` has children
``2k`` and ``2k + 1`` and leaf ``i`` sits at ``leaves + i``.  A power-of-two layout keeps every
leaf at the same depth, which is what lets ``find`` descend a whole batch of queries in
lock-step with one numpy operation per level instead of one Python iteration per query.
Padding leaves beyond ``capacity`` hold zero and therefore can never be returned by ``find``.
"""

from __future__ import annotations

import numpy as np

from zrl.replay.checks import check_int


class SumTree:
    """Sum tree over ``capacity`` non-negative leaf priorities.

    Internal nodes are always recomputed as ``left + right`` from their children (never
    adjusted by a delta), so every node is a deterministic function of the leaves: there is
    no accumulated float drift, and rebuilding from saved leaves reproduces the tree bit for
    bit, which makes checkpoint/resume sampling exactly reproducible.
    """

    capacity: int

    def __init__(self, capacity: int) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        self._depth = (self.capacity - 1).bit_length()  # number of levels below the root
        self._leaves = 1 << self._depth
        self._tree = np.zeros(2 * self._leaves, dtype=np.float64)

    # ------------------------------------------------------------------ validation helpers
    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.ndim != 1:
            idx = idx.reshape(-1)
        if idx.size == 0:
            return idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.capacity:
            bad = lo if lo < 0 else hi
            raise ValueError(f"leaf index {bad} out of range [0, {self.capacity})")
        return idx

    # ------------------------------------------------------------------ public API
    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities and refresh their ancestors.

        Duplicated indices resolve to the last value because callers pass batches straight
        from a learner, where a transition sampled twice gets two TD errors and the later
        one is the freshest. numpy's fancy assignment does not promise that order, so we
        deduplicate explicitly.
        """
        idx = self._check_indices(indices)
        pri = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if pri.size == 1 and idx.size != 1:
            pri = np.broadcast_to(pri, idx.shape)
        if pri.shape != idx.shape:
            raise ValueError(
                f"indices and priorities must have the same length, got {idx.size} and {pri.size}"
            )
        if idx.size == 0:
            return
        if not np.all(np.isfinite(pri)):
            raise ValueError(f"priorities must be finite, got {pri[~np.isfinite(pri)][:5]}")
        if np.any(pri < 0):
            raise ValueError(f"priorities must be >= 0, got {pri[pri < 0][:5]}")

        # Last occurrence of each index wins: unique() on the reversed array returns the
        # first (i.e. originally last) position of every distinct index.
        rev_idx = idx[::-1]
        uniq, first_in_rev = np.unique(rev_idx, return_index=True)
        nodes = uniq + self._leaves
        self._tree[nodes] = pri[::-1][first_in_rev]

        # Walk up one level at a time. Siblings share a parent, so a parent may be written
        # several times in one step, but always with the same value (computed from children
        # that are already final), hence no further deduplication is needed.
        tree = self._tree
        for _ in range(self._depth):
            nodes = nodes >> 1
            tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Return a copy of the leaf priorities at ``indices``."""
        idx = self._check_indices(indices)
        return self._tree[idx + self._leaves]

    def total(self) -> float:
        """Sum of all leaf priorities (the root)."""
        return float(self._tree[1])

    def find(self, values: np.ndarray) -> np.ndarray:
        """Map cumulative-priority query values to leaf indices.

        For ``value`` in ``[0, total)`` returns leaf ``i`` with
        ``prefix(i) <= value < prefix(i) + p_i``. Values outside that range are clamped to the
        first/last leaf with nonzero priority. The descent only ever steps into a child whose
        subtree sum is nonzero, so float rounding at the right edge (``value`` equal to or a
        hair above the sum of what remains) can never land on an empty leaf, which would
        otherwise give an item zero sampling probability and an infinite IS weight.
        """
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.size and not np.all(np.isfinite(vals)):
            raise ValueError(f"query values must be finite, got {vals[~np.isfinite(vals)][:5]}")
        if not self._tree[1] > 0.0:
            raise ValueError(f"cannot find in a sum tree with total {self.total()}")
        v = np.maximum(vals, 0.0)
        nodes = np.ones(v.shape, dtype=np.int64)
        tree = self._tree
        for _ in range(self._depth):
            left_child = 2 * nodes
            left = tree[left_child]
            right = tree[left_child + 1]
            go_right = (v >= left) & (right > 0.0)
            v = np.where(go_right, v - left, v)
            nodes = left_child + go_right
        return nodes - self._leaves

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self, copy: bool = True) -> dict[str, np.ndarray]:
        """Only leaves are saved: internal nodes are rebuilt identically on load
        (``copy=False``: a view of them, for a caller that leaves the tree untouched meanwhile)."""
        leaves = self._tree[self._leaves : self._leaves + self.capacity]
        return {
            "capacity": np.asarray(self.capacity, dtype=np.int64),
            "priorities": leaves.copy() if copy else leaves,
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        capacity = int(np.asarray(state["capacity"]))
        if capacity != self.capacity:
            raise ValueError(f"state has capacity {capacity}, this tree has {self.capacity}")
        pri = np.asarray(state["priorities"], dtype=np.float64).reshape(-1)
        if pri.shape != (self.capacity,):
            raise ValueError(f"state priorities have shape {pri.shape}, need ({self.capacity},)")
        if not np.all(np.isfinite(pri)) or np.any(pri < 0):
            raise ValueError("state priorities must be finite and >= 0")
        tree = np.zeros_like(self._tree)
        tree[self._leaves : self._leaves + self.capacity] = pri
        lo = self._leaves
        while lo > 1:
            # Same expression as update(): parent = left + right, so the rebuilt tree is
            # bitwise identical to one built incrementally.
            tree[lo // 2 : lo] = tree[lo : 2 * lo : 2] + tree[lo + 1 : 2 * lo : 2]
            lo //= 2
        self._tree = tree
