"""Replay of frame-stacked observations (Atari) that stores every frame once.

An Atari observation is a uint8 stack ``[k, H, W]`` of the last ``k`` frames, newest last.
Storing ``obs`` and ``next_obs`` per transition costs ``2k`` frames; consecutive stacks share
``k - 1`` frames, so a :class:`FrameTable` keeps single frames in a ring and small transition
items (action, n-step return, discount, three frame indices, weights version) in an inner
:class:`~zrl.replay.tables.UniformTable` or :class:`~zrl.replay.tables.PrioritizedTable`, and
rebuilds the stacks when it samples. Sizes for Pong (84x84, k = 4, frame = 7056 bytes), per
transition / for 1M transitions (bytes from :func:`bytes_per_transition`):

* obs + next_obs stacks as uint8:      56 464 B / 56.5 GB (float32 as today: 225.8 GB);
* FrameTable, T = 32 steps per trajectory: 8 002 B /  8.0 GB (T + k frames per T steps);
* FrameTable, T = 64:                  7 561 B /  7.6 GB.

The wire format of a trajectory's frames, the episode-start rule the stacks are rebuilt by and
their padding are the codec's (``zrl.codecs.frames``). Transitions start at valid steps and never
run past an invalid one, so obs and next_obs (obs_{end+1}, the terminal obs after a terminal
step) always share an episode.

**Items** carry global frame indices (a counter over all frames ever inserted):
``obs_frame``/``next_frame`` (newest frame of obs / next_obs) and ``first_frame``, the oldest
stored frame either stack reads; positions before it are padding. ``first_frame`` never
decreases with the key, so when the frame ring wraps, the transitions reading overwritten
frames are exactly the oldest keys: they are evicted first (``Table.evict_oldest``).
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any

import numpy as np

from zrl.codecs.frames import Padding, episode_first_frames
from zrl.codecs.nstep import nstep_transitions
from zrl.replay.checks import check_int
from zrl.replay.tables import (
    PrioritizedTable,
    SampledBatch,
    Table,
    check_priorities,
    make_table,
    restore_rows,
    written_rows,
)

FRAME_REFS = ("obs_frame", "next_frame", "first_frame")
ITEM_BYTES = 8 + 4 + 4 + 3 * 8 + 8  # action, reward, discount, 3 frame indices, weights version
KEY_BYTES = 16  # per item in the inner table beyond its columns: key and priority (as replay)


def assemble_frame_transitions(
    frames: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    priority: np.ndarray,
    n_step: int,
    gamma: float,
    stack: int | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One trajectory -> (n-step transition items, their initial priorities), row-major like
    ``zrl.replay.assemble.assemble_transitions``. Frame indices in the items are positions in
    ``frames.reshape(E * (T + k), H, W)``; :meth:`FrameTable.insert_trajectory` makes them
    global. ``stack``: the k the table rebuilds (ValueError if the trajectory's differs)."""
    frames = np.asarray(frames)
    reward = np.asarray(reward)
    valid = np.asarray(valid, dtype=bool)
    if reward.ndim != 2 or frames.ndim != 4 or frames.shape[0] != reward.shape[0]:
        raise ValueError(
            f"need frames [E, T + k, H, W] and [E, T] steps, got frames "
            f"{frames.shape} and reward {reward.shape}"
        )
    E, T = reward.shape
    k, row = frames.shape[1] - T, frames.shape[1]
    if k < 1 or (stack is not None and k != stack):
        want = "k >= 1" if stack is None else f"k = {stack}"
        raise ValueError(f"frames have {row} per env for {T} steps: need T + k, {want}")
    for name, arr in (("action", action), ("valid", valid), ("priority", priority)):
        if np.shape(arr) != (E, T):
            raise ValueError(f"{name} has shape {np.shape(arr)}, expected {(E, T)}")
    ns = nstep_transitions(reward, terminated, truncated, valid, n_step, gamma)
    start_pos = episode_first_frames(valid, k)  # row position of obs_i's episode's first frame
    base = ns.env * row
    items = {
        "action": np.asarray(action, dtype=np.int64)[ns.env, ns.start],
        "reward": ns.returns.astype(np.float32),
        "discount": ns.discounts.astype(np.float32),
        "obs_frame": base + k - 1 + ns.start,
        "next_frame": base + k + ns.end,
        "first_frame": base + np.maximum(start_pos[ns.env, ns.start], ns.start),
    }
    priorities = np.asarray(priority, dtype=np.float32)[ns.env, ns.start]
    if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
        raise ValueError("trajectory carries non-finite or negative priorities")
    return items, priorities


def bytes_per_transition(frame_shape: tuple[int, int], stack: int, trajectory_length: int) -> float:
    """Memory per transition of a full FrameTable whose steps are all valid: the frames of a
    trajectory row (T + k per T transitions) plus the item and its key/priority."""
    frame_bytes = math.prod(frame_shape)
    return frame_bytes * (trajectory_length + stack) / trajectory_length + ITEM_BYTES + KEY_BYTES


def _table_count(name: str) -> property:
    """A read-only property of :class:`FrameTable`: the inner table's ``name`` (counted in
    transitions, not frames)."""
    return property(attrgetter(f"table.{name}"), doc=f"The inner table's ``{name}``.")


class FrameTable:
    """A transition table over a ring of single frames; samples full ``obs``/``next_obs``.

    ``sample`` returns ``SampledBatch`` items ``obs, action, reward, discount, next_obs`` like
    the plain transition tables, with ``obs``/``next_obs`` uint8 ``[B, k, H, W]``.
    """

    kind = "frames"

    def __init__(
        self,
        table: Table,
        frame_capacity: int,
        frame_shape: tuple[int, int],
        stack: int,
        padding: Padding = "zero",
    ) -> None:
        if table.kind not in ("uniform", "prioritized"):
            raise ValueError(f"a FrameTable needs a uniform or prioritized table, not {table.kind}")
        if padding not in ("zero", "reset"):
            raise ValueError(f"padding must be 'zero' or 'reset', got {padding!r}")
        self.table = table
        self.frame_capacity = check_int("frame_capacity", frame_capacity, 1)
        self.stack = check_int("stack", stack, 1)
        self.frame_shape = (check_int("H", frame_shape[0], 1), check_int("W", frame_shape[1], 1))
        self.padding = padding
        self.frame_inserts = 0  # global index of the next frame; live: [oldest_frame, this)
        self._frames = np.zeros((self.frame_capacity, *self.frame_shape), np.uint8)
        self._offsets = np.arange(1 - self.stack, 1, dtype=np.int64)

    @classmethod
    def for_budget(
        cls,
        kind: str,
        capacity: int,
        capacity_bytes: int | None,
        frame_shape: tuple[int, int],
        stack: int,
        trajectory_length: int,
        num_envs: int = 1,
        padding: Padding = "zero",
        **table_kwargs: Any,
    ) -> FrameTable:
        """Transition capacity ``min(capacity, what capacity_bytes holds)`` at
        :func:`bytes_per_transition`, and a frame ring for that many transitions plus one
        trajectory of ``num_envs`` rows (never more frames than the budget has room for)."""
        T, k = check_int("trajectory_length", trajectory_length, 1), check_int("stack", stack, 1)
        row_frames = check_int("num_envs", num_envs, 1) * (T + k)
        items = check_int("capacity", capacity, 1)
        frames = math.ceil(items * (T + k) / T) + row_frames
        if capacity_bytes is not None:
            budget, frame_bytes = (
                check_int("capacity_bytes", capacity_bytes, 1),
                math.prod(frame_shape),
            )
            items = min(items, int(budget // bytes_per_transition(frame_shape, k, T)))
            frames = min(frames, (budget - items * (ITEM_BYTES + KEY_BYTES)) // frame_bytes)
            if items < 1 or frames < row_frames:
                raise ValueError(
                    f"capacity_bytes={budget} cannot hold one trajectory "
                    f"({row_frames} frames of {frame_bytes} bytes)"
                )
        return cls(make_table(kind, items, **table_kwargs), frames, frame_shape, k, padding)

    # ------------------------------------------------------------------ bookkeeping
    size = _table_count("size")
    capacity = _table_count("capacity")
    inserts = _table_count("inserts")
    samples = _table_count("samples")
    evicted = _table_count("evicted")

    @property
    def oldest_frame(self) -> int:
        """Global index of the oldest frame still in the ring."""
        return max(0, self.frame_inserts - self.frame_capacity)

    @property
    def nbytes(self) -> int:
        """Bytes held: the frame ring, the item columns and (prioritized) the sum tree."""
        return self._frames.nbytes + self.table.nbytes

    def _first_key_reading(self, frame: int) -> int:
        """The oldest live key whose ``first_frame`` is >= ``frame`` (``inserts`` if none):
        a binary search over the live keys' slots, which the ring splits in at most two."""
        t = self.table
        if not t.size:
            return t.inserts
        col = t.column("first_frame")
        start = t.first_key % t.capacity
        head = col[start : min(t.capacity, start + t.size)]
        i = int(np.searchsorted(head, frame))
        if i == len(head) and t.size > len(head):
            i += int(np.searchsorted(col[: t.size - len(head)], frame))
        return t.first_key + i

    # ------------------------------------------------------------------ insert / sample
    def insert_trajectory(
        self,
        frames: np.ndarray,
        items: dict[str, np.ndarray],
        priorities: np.ndarray | None = None,
    ) -> np.ndarray:
        """Store a trajectory's ``frames [E, T + k, H, W]`` and the items
        :func:`assemble_frame_transitions` made of them; returns the items' keys.

        Transitions reading frames the ring overwrites are evicted first (oldest keys).
        ``priorities`` is ignored by a uniform table. A rejected call changes nothing."""
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[2:] != self.frame_shape:
            raise ValueError(
                f"frames must be uint8 [E, R, {self.frame_shape[0]}, "
                f"{self.frame_shape[1]}], got {frames.dtype} {frames.shape}"
            )
        n_frames = frames.shape[0] * frames.shape[1]
        if n_frames > self.frame_capacity:
            raise ValueError(
                f"{n_frames} frames in one trajectory: the ring holds {self.frame_capacity}"
            )
        arrays, n = self.table.validate_items(items)
        if not set(FRAME_REFS) <= set(arrays):
            raise ValueError(f"items need the frame indices {FRAME_REFS}, got {sorted(arrays)}")
        obs, nxt, first = (arrays[name].astype(np.int64) for name in FRAME_REFS)
        if n and not (
            np.all((first >= 0) & (first <= obs) & (obs - first < self.stack))
            and np.all((obs < nxt) & (nxt < n_frames))
            and np.all(np.diff(first) >= 0)
        ):
            raise ValueError("frame indices out of order or outside the trajectory's stacks")
        prioritized = isinstance(self.table, PrioritizedTable)
        if prioritized and priorities is not None:
            check_priorities(priorities, n)
        # Make room: evict what reads frames the new ones overwrite, then write them.
        oldest = max(0, self.frame_inserts + n_frames - self.frame_capacity)
        self.table.evict_oldest(self._first_key_reading(oldest) - self.table.first_key)
        slots = (self.frame_inserts + np.arange(n_frames)) % self.frame_capacity
        self._frames[slots] = frames.reshape(n_frames, *self.frame_shape)
        arrays.update(
            zip(
                FRAME_REFS,
                (obs + self.frame_inserts, nxt + self.frame_inserts, first + self.frame_inserts),
                strict=True,
            )
        )
        self.frame_inserts += n_frames
        return self.table.insert(arrays, priorities if prioritized else None)

    def _rebuild(self, small: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Small items -> ``obs, action, reward, discount, next_obs`` with one gather, and
        the other columns the items carry (``weights_version``) as they are."""
        first = small["first_frame"]
        if first.size and first.min() < self.oldest_frame:
            raise RuntimeError("a live transition reads an overwritten frame")  # a bug, not data
        b = first.shape[0]
        newest = np.concatenate([small["obs_frame"], small["next_frame"]])
        lowest = np.concatenate([first, first])[:, None]
        index = newest[:, None] + self._offsets  # [2B, k] global frame indices
        stacks = self._frames[np.maximum(index, lowest) % self.frame_capacity]
        if self.padding == "zero":
            stacks[index < lowest] = 0
        rest = {name: col for name, col in small.items() if name not in FRAME_REFS}
        return {"obs": stacks[:b], **rest, "next_obs": stacks[b:]}

    def sample(self, batch_size: int, rng: np.random.Generator) -> SampledBatch:
        batch = self.table.sample(batch_size, rng)
        batch.items = self._rebuild(batch.items)
        return batch

    def lookup(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """The items of live ``keys`` as ``sample`` returns them (ValueError for others)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if not np.all(self.table.live_mask(keys)):
            raise ValueError(f"keys not live: {keys[~self.table.live_mask(keys)][:5]}")
        return self._rebuild(self.table.gather(keys))

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self.table.update_priorities(keys, priorities)

    # ------------------------------------------------------------------ snapshots
    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        """As ``Table.state_dict`` (``copy=False``: views of the frames and rows)."""
        frames = self._frames[: written_rows(self.frame_inserts, self.frame_capacity)]
        return {
            "kind": self.kind,
            "frame_capacity": self.frame_capacity,
            "frame_shape": list(self.frame_shape),
            "stack": self.stack,
            "padding": self.padding,
            "frame_inserts": self.frame_inserts,
            # the frames written so far (slot i % frame_capacity), not the unwritten rest
            "frames": frames.copy() if copy else frames,
            "table": self.table.state_dict(copy),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        layout = ("kind", "frame_capacity", "frame_shape", "stack", "padding")
        mine = {
            "kind": self.kind,
            "frame_capacity": self.frame_capacity,
            "stack": self.stack,
            "frame_shape": list(self.frame_shape),
            "padding": self.padding,
        }
        theirs = {name: state[name] for name in layout}
        theirs["frame_shape"] = [int(x) for x in theirs["frame_shape"]]
        if mine != theirs:
            raise ValueError(f"state is for {theirs}, this table is {mine}")
        frame_inserts = check_int("frame_inserts", state["frame_inserts"], 0)
        saved = np.asarray(state["frames"])
        if saved.dtype != np.uint8 or saved.shape[1:] != self._frames.shape[1:]:
            raise ValueError(f"state frames are {saved.dtype} {saved.shape}")
        rows = written_rows(frame_inserts, self.frame_capacity)
        frames = restore_rows(saved, rows, self.frame_capacity, "state frames")
        table = make_table(self.table.kind, self.table.capacity)
        table.load_state_dict(state["table"])
        if table.size:
            small = table.gather(np.arange(table.first_key, table.inserts))
            if small["first_frame"].min() < max(0, frame_inserts - self.frame_capacity) or (
                small["next_frame"].max() >= frame_inserts
            ):
                raise ValueError("state has transitions reading frames it does not hold")
        self.table, self._frames, self.frame_inserts = table, frames, frame_inserts

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FrameTable:
        """A table shaped like the one that wrote ``state``, loaded from it."""
        inner = make_table(state["table"]["kind"], int(state["table"]["capacity"]))
        shape = (int(state["frame_shape"][0]), int(state["frame_shape"][1]))
        table = cls(
            inner, int(state["frame_capacity"]), shape, int(state["stack"]), state["padding"]
        )
        table.load_state_dict(state)
        return table

    def __repr__(self) -> str:
        live = self.frame_inserts - self.oldest_frame
        return (
            f"FrameTable({self.table!r}, frames={live}/{self.frame_capacity} of "
            f"{self.frame_shape[0]}x{self.frame_shape[1]}, stack={self.stack}, "
            f"padding={self.padding!r})"
        )
