"""Replay tables: columnar ring-buffer storage plus a sampling policy.

Items are stored column-wise (one preallocated numpy array per field) rather than as a list
of dicts, so a batch insert or a batch sample is one fancy-indexing operation per field and
sampled batches come out already stacked for the learner.

Every inserted item gets a key from a monotonically increasing int64 counter and lives in
slot ``key % capacity``. Keys, not slots, are handed out so that a learner's priority
update for an item that has since been overwritten can be recognised and dropped: the
live keys are always the contiguous range ``[first_key, inserts)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from zrl.replay.checks import check_int
from zrl.replay.sumtree import SumTree


@dataclass
class SampledBatch:
    """A sampled batch with what a learner needs for IS correction and priority updates."""

    keys: np.ndarray  # int64 [B]
    items: dict[str, np.ndarray]  # copies, [B, ...]
    weights: np.ndarray  # float32 [B] importance-sampling weights
    probabilities: np.ndarray  # float64 [B] sampling probability of each item

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def check_priorities(priorities: np.ndarray, n: int) -> np.ndarray:
    pri = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if pri.shape != (n,):
        raise ValueError(f"expected {n} priorities, got {pri.size}")
    bad = ~np.isfinite(pri) | (pri < 0)
    if np.any(bad):
        raise ValueError(f"priorities must be finite and >= 0, got {pri[bad][:5]}")
    return pri


def written_rows(inserts: int, capacity: int) -> int:
    """How many rows of a ring of ``capacity`` slots ``inserts`` writes have filled: slot
    ``i % capacity`` for the i-th, so rows ``[0, min(inserts, capacity))``."""
    return min(max(inserts, 0), capacity)


def restore_rows(saved: np.ndarray, rows: int, capacity: int, what: str) -> np.ndarray:
    """A ring's storage of ``capacity`` rows from the ``rows`` written ones a snapshot saved
    (the rest zeros); one written whole (``capacity`` rows, as snapshots were until
    2026-11-27) is taken as it is. ValueError naming ``what`` when ``saved`` is neither."""
    if saved.ndim == 0 or saved.shape[0] not in (rows, capacity):
        raise ValueError(f"{what} has shape {saved.shape}: {rows} or {capacity} rows expected")
    if saved.shape[0] == capacity:
        return np.array(saved, copy=True)
    full = np.zeros((capacity, *saved.shape[1:]), dtype=saved.dtype)
    full[:rows] = saved
    return full


class Table(ABC):
    """Shared storage and bookkeeping; subclasses decide how items are sampled.

    Attributes:
        capacity: maximum number of items held at once.
        inserts: total number of items ever inserted (also the next key to hand out).
        samples: total number of items ever sampled (batch_size per sample call).
        evicted: items that left the table by being overwritten rather than sampled out.
    """

    kind: str = ""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        self.inserts = 0
        self.samples = 0
        self.evicted = 0
        self._first_key = 0  # oldest live key; live keys are [_first_key, inserts)
        self._columns: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ storage
    @property
    def size(self) -> int:
        return self.inserts - self._first_key

    @property
    def first_key(self) -> int:
        """The oldest live key: live keys are ``[first_key, inserts)``."""
        return self._first_key

    def column(self, name: str) -> np.ndarray:
        """The storage of field ``name``, ``[capacity, ...]``, indexed by ``key % capacity``
        (read it, do not write it)."""
        return self._columns[name]

    @property
    def schema(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Field name -> (dtype, per-item shape), fixed by the first insert."""
        return {k: (v.dtype, v.shape[1:]) for k, v in self._columns.items()}

    @property
    def nbytes(self) -> int:
        """Bytes of the item columns (allocated at the first insert, or by :meth:`allocate`)."""
        return sum(c.nbytes for c in self._columns.values())

    def allocate(self, example: dict[str, np.ndarray]) -> None:
        """Fix the schema before any insert: one column per field of ``example`` (items shaped
        ``[n, ...]``, as :meth:`insert` takes them), ``capacity`` rows each. Every later insert
        must match it; a table that holds items keeps its columns."""
        if self.size:
            raise ValueError("allocate fixes the schema of an empty table only")
        arrays, _ = self.validate_items(example)
        self._columns = {
            name: np.zeros((self.capacity, *arr.shape[1:]), dtype=arr.dtype)
            for name, arr in arrays.items()
        }

    def validate_items(self, items: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """``items`` as arrays and their common length; ValueError where they do not fit the
        table's schema (once it has one)."""
        if not isinstance(items, dict) or not items:
            raise ValueError(f"items must be a non-empty dict of arrays, got {type(items)}")
        arrays = {str(k): np.asarray(v) for k, v in items.items()}
        lengths = {}
        for name, arr in arrays.items():
            if arr.ndim == 0:
                raise ValueError(f"field {name!r} needs a leading batch dimension, got a scalar")
            lengths[name] = arr.shape[0]
        if len(set(lengths.values())) != 1:
            raise ValueError(f"all fields need the same batch length, got {lengths}")
        n = next(iter(lengths.values()))
        if self._columns:
            missing = sorted(set(self._columns) - set(arrays))
            extra = sorted(set(arrays) - set(self._columns))
            if missing or extra:
                raise ValueError(
                    f"item fields do not match the table schema: missing {missing}, "
                    f"unexpected {extra}"
                )
            for name, arr in arrays.items():
                col = self._columns[name]
                if arr.dtype != col.dtype:
                    raise ValueError(f"field {name!r} has dtype {arr.dtype}, table has {col.dtype}")
                if arr.shape[1:] != col.shape[1:]:
                    raise ValueError(
                        f"field {name!r} has item shape {arr.shape[1:]}, table has {col.shape[1:]}"
                    )
        return arrays, n

    def _write(self, items: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """Store items; returns (all keys, slots actually written, index of first kept item)."""
        arrays, n = self.validate_items(items)
        if not self._columns:
            self._columns = {
                name: np.zeros((self.capacity, *arr.shape[1:]), dtype=arr.dtype)
                for name, arr in arrays.items()
            }
        keys = np.arange(self.inserts, self.inserts + n, dtype=np.int64)
        start = max(0, n - self.capacity)  # items before this are overwritten within the batch
        slots = keys[start:] % self.capacity
        for name, arr in arrays.items():
            self._columns[name][slots] = arr[start:]
        self.inserts += n
        new_first = max(self._first_key, self.inserts - self.capacity)
        self.evicted += new_first - self._first_key
        self._first_key = new_first
        return keys, slots, start

    def live_mask(self, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` are live."""
        return (keys >= self._first_key) & (keys < self.inserts)

    def _keys_of_slots(self, slots: np.ndarray) -> np.ndarray:
        # Live keys form a contiguous range no longer than capacity, so each slot maps back to
        # exactly one live key without storing a slot->key array.
        return self._first_key + (slots - self._first_key) % self.capacity

    def gather(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the items of ``keys`` (live ones: the caller checks), field by field."""
        slots = keys % self.capacity
        return {name: col[slots] for name, col in self._columns.items()}

    def _check_sample(self, batch_size: int) -> int:
        batch_size = check_int("batch_size", batch_size, 1)
        if self.size == 0:
            raise ValueError(f"cannot sample {batch_size} items from an empty {self.kind} table")
        return batch_size

    # ------------------------------------------------------------------ public API
    def insert(
        self, items: dict[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Insert a batch of ``n`` items (each field shaped ``[n, ...]``) and return their keys.

        ``n`` may exceed capacity: all ``n`` keys are returned (the counter advances by ``n``)
        but only the last ``capacity`` items are kept, as if inserted one by one.
        ``priorities`` is ignored by tables without priorities.
        """
        keys, _, _ = self._write(items)
        return keys

    @abstractmethod
    def sample(self, batch_size: int, rng: np.random.Generator) -> SampledBatch:
        """Sample ``batch_size`` items; ValueError if the table is empty."""

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Tables without priorities accept and ignore updates so learners stay table-agnostic."""
        return 0

    def evict_oldest(self, n: int) -> int:
        """Evict the ``n`` oldest live items (fewer if fewer are live) before the ring would
        overwrite them, e.g. because data they refer to elsewhere is gone
        (:class:`zrl.replay.frames.FrameTable`). They are never sampled again, priority
        updates for their keys are dropped, and they count in ``evicted``. Returns how many
        were evicted."""
        n = min(check_int("n", n, 0), self.size)
        if n:
            self._forget(np.arange(self._first_key, self._first_key + n, dtype=np.int64))
            self._first_key += n
            self.evicted += n
        return n

    def _forget(self, keys: np.ndarray) -> None:
        """Hook for :meth:`evict_oldest`: drop per-slot state of ``keys`` (still live)."""
        return None

    def fill_missing_column(self, name: str, value: int | float, dtype: Any) -> bool:
        """Give the items a scalar column ``name`` holding ``value`` when they lack it: a table
        loaded from a snapshot written before its items carried that field takes the items
        that now do. False (nothing changed) if the column exists or nothing was inserted yet
        (the first insert fixes the schema)."""
        if not self._columns or name in self._columns:
            return False
        self._columns[name] = np.full(self.capacity, value, dtype=dtype)
        return True

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        """Everything needed for an exact resume: the counters and a copy of the rows written
        so far (slot ``key % capacity``: rows ``[0, min(inserts, capacity))``), not the
        unwritten rest of the columns, so a snapshot of a big table still filling (1M
        transitions, SAC's) costs what it holds. ``copy=False``: views of the table's own
        storage instead, for a caller that leaves the table untouched until it is done with
        them (a replay shard writing its snapshot: no second copy of gigabytes)."""
        rows = written_rows(self.inserts, self.capacity)
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "inserts": self.inserts,
            "samples": self.samples,
            "evicted": self.evicted,
            "first_key": self._first_key,
            "columns": {
                name: col[:rows].copy() if copy else col[:rows]
                for name, col in self._columns.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"state is for a {state['kind']!r} table, this is {self.kind!r}")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"state has capacity {state['capacity']}, table has {self.capacity}")
        inserts, first_key = int(state["inserts"]), int(state["first_key"])
        if not 0 <= inserts - first_key <= self.capacity or first_key < 0:
            raise ValueError(f"inconsistent state: inserts={inserts}, first_key={first_key}")
        rows = written_rows(inserts, self.capacity)
        columns = {
            str(k): restore_rows(np.asarray(v), rows, self.capacity, f"state column {k!r}")
            for k, v in state["columns"].items()
        }
        self._columns = columns
        self.inserts = inserts
        self._first_key = first_key
        self.samples = int(state["samples"])
        self.evicted = int(state["evicted"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, size={self.size}, "
            f"inserts={self.inserts}, samples={self.samples})"
        )


class UniformTable(Table):
    """Uniform sampling with replacement (DQN-style replay)."""

    kind = "uniform"

    def sample(self, batch_size: int, rng: np.random.Generator) -> SampledBatch:
        batch_size = self._check_sample(batch_size)
        size = self.size
        keys = self._first_key + rng.integers(0, size, size=batch_size, dtype=np.int64)
        self.samples += batch_size
        return SampledBatch(
            keys=keys,
            items=self.gather(keys),
            weights=np.ones(batch_size, dtype=np.float32),
            probabilities=np.full(batch_size, 1.0 / size, dtype=np.float64),
        )


class PrioritizedTable(Table):
    """Proportional prioritized replay (Schaul et al. 2016).

    Stored priority is ``(|priority| + epsilon) ** alpha``; epsilon keeps zero-error items
    sampleable. Sampling is stratified (one uniform draw in each of ``batch_size`` equal
    segments of the total), which lowers the variance of the batch composition compared with
    independent draws. ``beta`` is public so a schedule can anneal it towards 1.
    """

    kind = "prioritized"

    def __init__(
        self, capacity: int, alpha: float = 0.6, beta: float = 0.4, epsilon: float = 1e-6
    ) -> None:
        super().__init__(capacity)
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be finite and >= 0, got {beta}")
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.epsilon = float(epsilon)
        self.max_priority = 1.0  # raw (untransformed) priority given to items inserted without one
        self._tree = SumTree(self.capacity)

    def _transform(self, raw: np.ndarray) -> np.ndarray:
        return np.power(np.abs(raw) + self.epsilon, self.alpha)

    def insert(
        self, items: dict[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Insert items; without ``priorities`` they get the max priority seen so far so that
        every new transition is likely to be replayed at least once before its error is known.
        """
        # Validate priorities before touching storage so a bad call leaves the table unchanged.
        n = self.validate_items(items)[1]
        raw = None if priorities is None else check_priorities(priorities, n)
        keys, slots, start = self._write(items)
        if raw is None:
            stored = np.full(slots.shape, self._transform(np.array(self.max_priority)))
        else:
            if raw.size:
                self.max_priority = max(self.max_priority, float(raw.max()))
            stored = self._transform(raw[start:])
        self._tree.update(slots, stored)
        return keys

    def sample(self, batch_size: int, rng: np.random.Generator) -> SampledBatch:
        batch_size = self._check_sample(batch_size)
        total = self._tree.total()
        segment = total / batch_size
        values = (np.arange(batch_size, dtype=np.float64) + rng.random(batch_size)) * segment
        slots = self._tree.find(values)
        keys = self._keys_of_slots(slots)
        probabilities = self._tree.get(slots) / total
        weights = np.power(self.size * probabilities, -self.beta)
        weights /= weights.max()
        self.samples += batch_size
        return SampledBatch(
            keys=keys,
            items=self.gather(keys),
            weights=weights.astype(np.float32),
            probabilities=probabilities,
        )

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Apply new raw priorities (e.g. |TD error|) to the keys that are still live.

        Updates for evicted or never-inserted keys are silently dropped: with asynchronous
        learners the item may well have been overwritten while its batch was in flight.
        If a key repeats, the last priority wins.
        """
        keys = np.asarray(keys).reshape(-1)
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            raise ValueError(f"keys must be integers, got dtype {keys.dtype}")
        keys = keys.astype(np.int64, copy=False)
        raw = check_priorities(priorities, keys.size)
        live = self.live_mask(keys)
        applied = int(live.sum())
        if applied:
            raw_live = raw[live]
            self.max_priority = max(self.max_priority, float(raw_live.max()))
            self._tree.update(keys[live] % self.capacity, self._transform(raw_live))
        return applied

    def _forget(self, keys: np.ndarray) -> None:
        # Zero priority: the sum tree's descent never reaches these slots any more.
        self._tree.update(keys % self.capacity, np.zeros(keys.shape))

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        state = super().state_dict(copy)
        state.update(
            alpha=self.alpha,
            beta=self.beta,
            epsilon=self.epsilon,
            max_priority=self.max_priority,
            tree=self._tree.state_dict(copy),
        )
        return state

    @property
    def nbytes(self) -> int:
        """Bytes of the item columns and the sum tree."""
        return super().nbytes + self._tree._tree.nbytes

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # alpha/epsilon define how the saved tree values were computed, so they are restored
        # together with it; beta is restored so an annealing schedule resumes where it was.
        self.alpha = float(state["alpha"])
        self.beta = float(state["beta"])
        self.epsilon = float(state["epsilon"])
        self.max_priority = float(state["max_priority"])
        self._tree.load_state_dict(state["tree"])


class FifoQueue(Table):
    """On-policy queue: each item is consumed exactly once, oldest first (IMPALA/PPO).

    ``sample`` removes what it returns. If actors outrun the learner and the queue is full,
    the oldest unconsumed items are dropped and counted in ``evicted`` so staleness pressure
    is visible in metrics rather than silent.

    Items pass through without a stop in the columns where they can: an insert that fits is
    kept as it came (the arrays referenced, not copied: the caller hands them over and does
    not write them again), and a sample of the oldest held inserts concatenates them
    straight into the batch, one copy per field (a split insert's rest stays held, a view).
    Whatever reads the columns (a full queue's eviction, :meth:`gather`, :meth:`column`, a
    snapshot) writes the held items into them first, so the keys, the counters, the byte
    bound (``capacity`` items) and the snapshot format are the ring's.
    """

    kind = "fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._held: deque[dict[str, np.ndarray]] = deque()
        """Inserts not written to the columns, oldest first: the newest live keys, each
        insert's ``[n, ...]`` arrays as given."""
        self._held_items = 0

    def insert(
        self, items: dict[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        arrays, n = self.validate_items(items)
        if not self._columns or self.size + n > self.capacity:  # the ring's: fix or evict
            self.write_held()
            return super().insert(arrays)
        keys = np.arange(self.inserts, self.inserts + n, dtype=np.int64)
        if n:
            self._held.append(arrays)
            self._held_items += n
            self.inserts += n
        return keys

    def write_held(self) -> None:
        """Write the held inserts into the columns, at their keys' slots."""
        key = self.inserts - self._held_items
        while self._held:
            arrays = self._held.popleft()
            n = len(next(iter(arrays.values())))
            slots = np.arange(key, key + n) % self.capacity
            for name, arr in arrays.items():
                self._columns[name][slots] = arr
            key += n
        self._held_items = 0

    def sample(self, batch_size: int, rng: np.random.Generator) -> SampledBatch:
        """Pop the oldest ``batch_size`` items. ``rng`` is unused (kept for a common API).

        Probabilities are 1: each item is taken with certainty, so no IS correction applies.
        """
        batch_size = self._check_sample(batch_size)
        if self.size < batch_size:
            raise ValueError(f"fifo queue holds {self.size} items, cannot pop {batch_size}")
        keys = np.arange(self._first_key, self._first_key + batch_size, dtype=np.int64)
        if self._held_items == self.size:  # all held: straight from the inserts
            items = self._take_held(batch_size)
        else:
            self.write_held()
            items = self.gather(keys)
        self._first_key += batch_size
        self.samples += batch_size
        return SampledBatch(
            keys=keys,
            items=items,
            weights=np.ones(batch_size, dtype=np.float32),
            probabilities=np.ones(batch_size, dtype=np.float64),
        )

    def _take_held(self, n: int) -> dict[str, np.ndarray]:
        """The oldest ``n`` held items, concatenated (one copy) and no longer held."""
        parts: list[dict[str, np.ndarray]] = []
        taken = 0
        while taken < n:
            arrays = self._held.popleft()
            m = len(next(iter(arrays.values())))
            if taken + m > n:  # split it: the rest stays held, a view
                cut = n - taken
                self._held.appendleft({name: arr[cut:] for name, arr in arrays.items()})
                arrays, m = {name: arr[:cut] for name, arr in arrays.items()}, cut
            parts.append(arrays)
            taken += m
        self._held_items -= n
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def gather(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        self.write_held()
        return super().gather(keys)

    def column(self, name: str) -> np.ndarray:
        self.write_held()
        return super().column(name)

    def evict_oldest(self, n: int) -> int:
        self.write_held()
        return super().evict_oldest(n)

    def fill_missing_column(self, name: str, value: int | float, dtype: Any) -> bool:
        self.write_held()
        return super().fill_missing_column(name, value, dtype)

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        self.write_held()
        return super().state_dict(copy)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._held.clear()
        self._held_items = 0


_TABLES: dict[str, type[Table]] = {
    "uniform": UniformTable,
    "prioritized": PrioritizedTable,
    "fifo": FifoQueue,
}


def make_table(kind: str, capacity: int, **kwargs: Any) -> Table:
    """Build a table by name, as used from config files (``replay.kind: prioritized``)."""
    cls = _TABLES.get(kind)
    if cls is None:
        raise ValueError(f"unknown table kind {kind!r}; valid kinds: {sorted(_TABLES)}")
    return cls(capacity, **kwargs)
