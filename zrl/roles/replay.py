"""``ReplayServer``: one replay shard — a table, a rate limiter, prefetched batches.

Sockets:

- PULL ``experience`` <- actors (via the broker): TRAJECTORY messages of the one layout
  fixed at setup from the config and the env's spaces (``zrl.replay.layout``: a probe env,
  and for recurrent items the model's state width; anything else is dropped and counted in
  ``layout_refused``), assembled (``zrl.replay.assemble``) into n-step transitions (R2D2: the
  sequences the actor cut, one item each; IMPALA/APPO: each env's whole unroll, with its
  recurrent state and episode starts when ``model.core`` is set) and inserted
  (``frame_transitions`` of Atari frame stacks into a ``FrameTable``, which stores each frame
  once and rebuilds the stacks when it samples; a FIFO queue keeps the decoded unrolls as
  they came and concatenates them into the batch, one copy: ``zrl.replay.tables.FifoQueue``).
  Read only while the rate limiter allows inserts, so a shard that is ahead of its learners
  applies back-pressure to the actors instead of growing.
- PUSH ``batches`` -> learners (via the broker): BATCH messages, sampled while the rate
  limiter allows and fewer than ``replay.prefetch`` batches are unacknowledged. That credit
  window, not the sockets' high-water marks (which count messages per hop, beside the
  kernel's buffers), bounds how old the sampled data waiting for the learners can get.
- PUB ``acks/<actor id>/`` (topic bus): an ACK of each inserted trajectory to the actor that
  sent it, with this shard's ``incarnation`` (random at each start); and
  ``incarnations/<shard id>/``: that incarnation, once a second, so an actor learns of a
  restart at once (docs/protocol.md, ``incarnation``).
- SUB ``priorities/<shard id>/`` and ``batch-acks/<shard id>/`` (topic bus): PRIORITIES
  for the keys this shard sampled, and a learner's ACK of each batch it received.
  They travel by topic, not on a load-balanced stream, because they must reach the
  shard that owns the keys.

Several shards share the load by simply starting more of them: the experience
stream load-balances trajectories across them.

The table is built at setup for that layout, its columns allocated for ``replay.capacity``
items (fewer under ``replay.capacity_bytes``): no message changes what it holds or how big
it is. A snapshot (``checkpoint.replay``) is restored only into such a table, read within its
bytes (``zrl.replay.snapshot``); one that cannot be is moved aside to
``<id>.snapshot.refused-<time>``, never written over, and named in the heartbeat
(``snapshot_refused``), and the shard starts empty. Every ``checkpoint.interval`` the shard
writes its snapshot in a thread (``zrl.replay.snapshot.BackgroundSave``) from views of the
table, which it holds still meanwhile (no inserts, no samples) while its loop goes on
heartbeating: a full 1M-row table takes seconds, longer than ``broker.heartbeat_timeout``.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zrl.algos.registry import get_algorithm
from zrl.config.experiment import ExperimentConfig
from zrl.replay.assemble import assemble_items
from zrl.replay.frames import FrameTable, assemble_frame_transitions
from zrl.replay.layout import (
    ExperienceLayout,
    carries_state,
    envs_per_actor,
    experience_layout,
)
from zrl.replay.rate_limiter import RateLimiter
from zrl.replay.snapshot import BackgroundSave, SnapshotError, load_state
from zrl.replay.tables import PrioritizedTable, Table, make_table
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.credit import AckLatency
from zrl.transport.schema import validate

INSERTS_PER_STEP = 32
SAMPLES_PER_STEP = 16
BATCH_ACK_TIMEOUT_S = 2.0  # then a dead learner or a lost ack no longer holds sampling back
# (or three times the slowest recent ack, where a loaded learner takes batches that slowly)
INCARNATION_INTERVAL_S = 1.0  # how often the shard announces its incarnation to the actors
KEY_BYTES = 16  # per item beyond its columns: its key and priority
SNAPSHOT_SLACK_BYTES = 1 << 16  # a snapshot's arrays beyond the table's own (rng, counters)


def frame_items(
    config: ExperimentConfig, msg: P.Message, stack: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A ``frame_transitions`` TRAJECTORY of the shard's layout -> (the items of its
    FrameTable, their initial priorities)."""
    rc, a = config.replay, msg.arrays
    try:
        items, priorities = assemble_frame_transitions(
            a["frames"],
            a["action"],
            a["reward"],
            a["terminated"],
            a["truncated"],
            a["valid"],
            a["priority"],
            rc.n_step,
            rc.gamma,
            stack=stack,
        )
    except ValueError as exc:
        raise P.ProtocolError(str(exc)) from None
    items["weights_version"] = np.full(len(priorities), M.trajectory_version(msg.meta), np.int64)
    return items, priorities


class ReplayServer(Role):
    role = "replay"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.snapshot_path: Path | None = None  # set in setup when checkpoint.replay asks
        self.next_snapshot = 0.0
        self.snapshots = 0
        self.snapshot_write: BackgroundSave | None = None  # while one is being written
        self.snapshot_seconds: float | None = None  # how long the last one took
        # Which start of this shard it is: acks and announcements carry it (see the module
        # docstring). A restart is a new object, so a new one.
        self.incarnation = M.new_incarnation()
        self.next_announce = 0.0

    def setup(self) -> None:
        rc = self.config.replay
        self.layout = self.experience_layout()
        self.table: Table | FrameTable = self.make_table_for(self.layout)
        self.limiter = RateLimiter(
            rc.min_size, rc.samples_per_insert, rc.samples_per_insert_tolerance
        )
        self.rng = np.random.default_rng(self.config.seed + 7919 * (1 + (self.index or 0)))
        self.experience = self.open_pull("experience", hwm=2)
        self.batches = self.open_push("batches", hwm=rc.prefetch, sndtimeo_ms=0)
        self.priorities = self.open_subscriber(
            [P.priority_topic(self.id), P.batch_ack_topic(self.id)], "priorities"
        )
        self.acked_batch_seq = -1
        self.learner_acked = False  # no learner took a batch yet: they may still be starting
        self.window_full_since: float | None = None
        self.batch_ack_timeouts = 0
        self.batch_ack_latency = AckLatency(BATCH_ACK_TIMEOUT_S)
        self.batch_sent_at: dict[int, float] = {}  # seq -> when; the batches in flight
        self.acks = self.open_publisher("acks")
        self.trajectories = 0
        # Since this process started (``trajectories`` survives a snapshot restore): what the
        # actors' delivery ledgers are checked against.
        self.trajectories_received = 0
        self.steps_received = 0
        self.last_insert = 0
        self.batches_sent = 0
        self.priority_updates = 0
        self.stale_priority_keys = 0
        self.weights_versions: list[int] = []
        self.layout_refused = 0  # trajectories of another layout than self.layout
        self.started = time.monotonic()
        snapshots = self.config.checkpoint.replay
        path = self.checkpoint_file(".snapshot") if snapshots else None
        self.next_snapshot = time.monotonic() + self.config.checkpoint.interval
        self.snapshots = 0
        self.snapshot_refused: str | None = None  # where a snapshot it could not load went
        self.restored_items: int | None = None  # the items of the snapshot it restored
        # Written to only once what was there is restored or moved aside.
        self.snapshot_path = path if path is None or self.load_snapshot(path) else None
        self.log.info(
            "%s table of %s, capacity %d (%.1f MB), n-step %d, min size %d, samples/insert %.1f",
            rc.table,
            self.layout.describe(),
            self.table.capacity,
            self.table.nbytes / 1e6,
            rc.n_step,
            rc.min_size,
            rc.samples_per_insert,
        )

    def experience_layout(self) -> ExperienceLayout:
        """What this shard's actors send: from the config and the spaces of a probe env (as
        the learner builds one), and the recurrent state's width from a model of them."""
        cfg = self.config
        algorithm = get_algorithm(cfg.algo)
        wiring = algorithm.wiring_for(cfg)
        probe = self.make_envs(num_envs=1)
        try:
            spaces = (probe.single_observation_space, probe.single_action_space)
            envs_per_game = int(probe.num_envs)
        finally:
            probe.close()
        item = wiring.replay_item or "transitions"
        state_size = None
        if carries_state(item, cfg.model.core != "none"):
            state_size = int(self.make_model(*spaces).state_size)
        sequence_length = None
        if algorithm.sequence_length is not None:
            sequence_length = algorithm.sequence_length(cfg)
        return experience_layout(
            item,
            actions=wiring.actions,
            observation_space=spaces[0],
            action_space=spaces[1],
            num_envs=envs_per_actor(cfg.env.num_envs, cfg.actor.env_groups, envs_per_game),
            trajectory_length=cfg.actor.trajectory_length,
            sequence_length=sequence_length,
            state_size=state_size,
            team=envs_per_game if wiring.team else 0,
        )

    def assemble(self, msg: P.Message) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """A TRAJECTORY of the shard's layout -> (the items it stores, their initial priorities
        or None). Frame stacks go through :func:`frame_items` instead."""
        rc = self.config.replay
        return assemble_items(self.layout, msg, rc.n_step, rc.gamma)

    def _table_kwargs(self) -> dict[str, Any]:
        rc = self.config.replay
        return {"alpha": rc.alpha, "beta": rc.beta} if rc.table == "prioritized" else {}

    def _make_table(self, capacity: int) -> Table:
        return make_table(self.config.replay.table, capacity, **self._table_kwargs())

    def make_table_for(self, layout: ExperienceLayout) -> Table | FrameTable:
        """The table of ``layout``'s items, its columns allocated: ``replay.capacity`` items,
        or fewer if ``replay.capacity_bytes`` holds fewer at the layout's item size."""
        rc = self.config.replay
        example = layout.example()
        if layout.frame_table:
            try:
                frames = FrameTable.for_budget(
                    rc.table,
                    rc.capacity,
                    rc.capacity_bytes,
                    layout.frame_shape,
                    layout.stack,
                    layout.dim("T"),
                    num_envs=layout.dim("E"),
                    **self._table_kwargs(),
                )
            except ValueError as exc:
                raise RoleError(f"replay: {exc}") from None
            frames.table.allocate(frame_items(self.config, example, layout.stack)[0])
            return frames
        items = self.assemble(example)[0]
        item_bytes = sum(v[0].nbytes for v in items.values()) + KEY_BYTES
        capacity = rc.capacity
        if rc.capacity_bytes:
            capacity = min(capacity, max(1, rc.capacity_bytes // item_bytes))
            self.log.info(
                "replay.capacity_bytes=%d at %d bytes per item: capacity %d items",
                rc.capacity_bytes,
                item_bytes,
                capacity,
            )
        table = self._make_table(capacity)
        table.allocate(items)
        return table

    def insert_frames(self, msg: P.Message) -> int:
        """A ``frame_transitions`` TRAJECTORY (checked against the layout) into the frame
        table; the number of transitions inserted."""
        table = self.table
        assert isinstance(table, FrameTable)
        items, priorities = frame_items(self.config, msg, table.stack)
        table.insert_trajectory(msg.arrays["frames"], items, priorities)
        return len(items["reward"])

    @property
    def size(self) -> int:
        return self.table.size

    # --- snapshots ----------------------------------------------------------------------

    def snapshot_state(self) -> dict[str, Any]:
        """Table, priorities, insertion order and limiter state; the table's arrays are views
        of its own storage (no second copy of gigabytes), so it must stay untouched until the
        state is written."""
        return {
            "capacity": self.table.capacity,
            "table": self.table.state_dict(copy=False),
            "limiter": self.limiter.state_dict(),
            "rng": self.rng.bit_generator.state,
            "trajectories": self.trajectories,
        }

    def save_snapshot(self) -> None:
        """Write the snapshot now and wait until it is written (after the one being written,
        if any)."""
        if self.snapshot_path is None:
            return
        self.finish_snapshot(wait=True)
        self.start_snapshot()
        self.finish_snapshot(wait=True)

    def start_snapshot(self) -> None:
        """Start writing the snapshot in a thread; ``step`` holds the table still (inserts
        nothing, samples nothing) and only heartbeats until it is written."""
        assert self.snapshot_path is not None and self.snapshot_write is None
        self.next_snapshot = float("inf")  # set again when this one is written
        self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        # npz, not pickle: checkpoint.dir comes from the broker, and loading must not run code.
        self.snapshot_write = BackgroundSave(self.snapshot_path, self.snapshot_state())

    def finish_snapshot(self, wait: bool = False, timeout: float = 0.0) -> bool:
        """Whether no snapshot is being written any more (waiting ``timeout`` for the one that
        is; ``wait``: until it is). A write that failed raises its error here, in the loop."""
        write = self.snapshot_write
        if write is None:
            return True
        if not write.done(None if wait else timeout):
            return False
        self.snapshot_write = None
        # The next one an interval after this one ended, not after it began.
        self.next_snapshot = time.monotonic() + self.config.checkpoint.interval
        if write.error is not None:
            raise write.error
        self.snapshot_seconds = round(write.seconds or 0.0, 3)
        self.snapshots += 1
        return True

    def load_snapshot(self, path: Path) -> bool:
        """Restore a snapshot written by :meth:`save_snapshot` from ``path``, if there is one
        (numpy ``.npz``, never a pickle, read within this table's bytes). Whether the shard
        may write its snapshots to ``path``.

        One that cannot be restored into this shard's table (damaged, a pickle from zrl <
        0.2, another layout, more than the config's capacity) is moved aside to
        ``*.refused-<time>``, never written over, and named in the heartbeat; the shard
        starts empty: refusing to start would only use up the supervisor's restarts."""
        if not path.is_file():
            return True
        try:  # into copies first: a snapshot refused half-way must leave nothing behind
            state = load_state(path, max_bytes=self.table.nbytes + SNAPSHOT_SLACK_BYTES)
            table = self.table_from_state(state)
            limiter, rng = copy.copy(self.limiter), copy.deepcopy(self.rng)
            limiter.load_state_dict(state["limiter"])
            rng.bit_generator.state = state["rng"]
            trajectories = int(state["trajectories"])
        except Exception as exc:  # noqa: BLE001 - whatever the file trips on, it is not restored
            return self.refuse_snapshot(path, exc)
        self.table, self.limiter, self.rng, self.trajectories = table, limiter, rng, trajectories
        self.restored_items = self.table.size
        self.log.info("restored %s: %d items", path, self.table.size)
        return True

    def table_from_state(self, state: dict[str, Any]) -> Table | FrameTable:
        """A table restored from a snapshot's state: of this shard's layout, at most its
        capacity (ValueError otherwise)."""
        mine, saved = self.table, state["table"]
        if not isinstance(saved, dict):
            raise ValueError("the snapshot holds no table")
        table: Table | FrameTable
        if isinstance(mine, FrameTable):
            if saved.get("kind") != FrameTable.kind:
                raise ValueError(f"a {saved.get('kind')!r} table, this shard stores frames")
            shape, stack = [int(n) for n in saved["frame_shape"]], int(saved["stack"])
            if (tuple(shape), stack) != (mine.frame_shape, mine.stack):
                raise ValueError(
                    f"frames {shape} in stacks of {stack}, this shard's are "
                    f"{list(mine.frame_shape)} in stacks of {mine.stack}"
                )
            frame_capacity, capacity = int(saved["frame_capacity"]), int(saved["table"]["capacity"])
            if not (0 < frame_capacity <= mine.frame_capacity and 0 < capacity <= mine.capacity):
                raise ValueError(
                    f"{capacity} items over {frame_capacity} frames, more than this shard's "
                    f"{mine.capacity} over {mine.frame_capacity}"
                )
            table = FrameTable.from_state_dict(saved)
        else:
            if saved.get("kind") == FrameTable.kind:
                raise ValueError("a frame table, this shard stores transitions")
            capacity = int(state["capacity"])
            if not 0 < capacity <= mine.capacity:
                raise ValueError(f"capacity {capacity}, this shard's is {mine.capacity}")
            table = self._make_table(capacity)
            table.load_state_dict(saved)
        # Snapshots before zrl kept each item's weights version lack the column: those
        # items' policy is unknown (not 0, which would count them as the initial weights and
        # inflate the lag), and learners leave them out of the policy lag.
        inner = table.table if isinstance(table, FrameTable) else table
        if inner.fill_missing_column("weights_version", M.UNKNOWN_VERSION, np.int64):
            self.log.info("the snapshot predates weights versions: its items' are unknown (-1)")
        expected = (mine.table if isinstance(mine, FrameTable) else mine).schema
        if not inner.size and not inner.schema:  # saved before its first insert
            inner.allocate(
                {k: np.zeros((1, *shape), dtype) for k, (dtype, shape) in expected.items()}
            )
        if inner.schema != expected:
            raise ValueError(f"items {inner.schema}, this shard stores {expected}")
        return table

    def refuse_snapshot(self, path: Path, exc: BaseException) -> bool:
        """Move an unloadable snapshot aside (False, and nothing is ever written to ``path``,
        if it cannot be moved) and say so in the log and the heartbeat."""
        why = exc if isinstance(exc, SnapshotError) else f"{type(exc).__name__}: {exc}"
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        aside = path.with_name(f"{path.name}.refused-{stamp}")
        n = 1
        while aside.exists():
            aside, n = path.with_name(f"{path.name}.refused-{stamp}-{n}"), n + 1
        try:
            os.replace(path, aside)
        except OSError as move_error:
            self.snapshot_refused = str(path)
            self.log.error(
                "cannot restore %s (%s) nor move it aside (%s): starting empty, and writing "
                "no snapshot over it",
                path,
                why,
                move_error,
            )
            return False
        self.snapshot_refused = str(aside)
        self.log.error("cannot restore %s (%s): moved it to %s, starting empty", path, why, aside)
        return True

    # --- handlers ---------------------------------------------------------------------

    def on_experience(self, msg: P.Message) -> None:
        """A message of the experience stream: a TRAJECTORY of this shard's layout is stored,
        anything else dropped (ProtocolError) and, if a trajectory, counted."""
        if msg.kind != P.TRAJECTORY:
            raise P.ProtocolError(f"experience stream carries {msg.kind!r}, expected trajectory")
        try:
            self.layout.check(msg)
        except P.ProtocolError:
            self.layout_refused += 1
            raise
        self.on_trajectory(msg)

    def on_trajectory(self, msg: P.Message) -> None:
        """Store a TRAJECTORY (of the layout: ``on_experience`` checked it) and ack it."""
        if isinstance(self.table, FrameTable):
            n = self.insert_frames(msg)
        else:
            items, priorities = self.assemble(msg)
            n = len(items["reward"])
            if n > 0:  # an actor may complete no sequence in a trajectory
                prioritized = isinstance(self.table, PrioritizedTable)
                self.table.insert(items, priorities if prioritized else None)
        self.last_insert = n
        self.limiter.on_insert(n)
        self.trajectories += 1
        self.trajectories_received += 1
        if "valid" in msg.arrays:
            self.steps_received += int(msg.arrays["valid"].sum())
        self.acks.send(
            P.Message(P.ACK, meta={"seq": msg.seq, "inserted": n, "incarnation": self.incarnation}),
            topic=P.ack_topic(msg.sender),
            block=False,
        )
        version = msg.meta.get("weights_version")
        if isinstance(version, int):
            self.weights_versions.append(version)
            del self.weights_versions[:-64]

    def on_learner_message(self, msg: P.Message) -> None:
        """From a learner: new priorities of sampled keys, or the ACK of a received batch."""
        if msg.kind == P.ACK:
            self.on_batch_ack(msg)
        else:
            self.on_priorities(msg)

    def on_batch_ack(self, msg: P.Message) -> None:
        # Only a learner's ack of a batch this incarnation sent opens the window; the newest
        # ack covers older ones, so a lost ack does not shrink the window.
        seq = P.acked_seq(msg, "learner-", self.batches.next_seq, "batch")
        self.acked_batch_seq = max(self.acked_batch_seq, seq)
        self.learner_acked = True
        sent_at = self.batch_sent_at.get(seq)
        if sent_at is not None:
            self.batch_ack_latency.observe(time.monotonic() - sent_at)
        self.batch_sent_at = {s: t for s, t in self.batch_sent_at.items() if s > seq}

    @property
    def batches_in_flight(self) -> int:
        return self.batches.next_seq - 1 - self.acked_batch_seq

    def window_open(self) -> bool:
        """Fewer than ``replay.prefetch`` batches are sampled but not yet taken by a learner."""
        if self.batches_in_flight < self.config.replay.prefetch:
            self.window_full_since = None
            return True
        now = time.monotonic()
        if self.window_full_since is None:
            self.window_full_since = now
        timeout_s = self.batch_ack_latency.timeout_s
        if now - self.window_full_since <= timeout_s:
            return False
        # A learner died holding batches, or its acks were lost: never deadlock on the window.
        self.batch_ack_timeouts += 1
        # Before any learner took a batch this is start-up (replay fills before the learners
        # are up), not a fault: a debug line, and the count in batch_ack_timeouts.
        self.log.log(
            logging.WARNING if self.learner_acked else logging.DEBUG,
            "no batch ack for %.0fs: resetting the window of %d batches",
            timeout_s,
            self.batches_in_flight,
        )
        self.acked_batch_seq = self.batches.next_seq - 1
        self.window_full_since = None
        return True

    def on_priorities(self, msg: P.Message) -> None:
        validate(msg, M.PRIORITIES)
        keys, prios = msg.arrays["key"], msg.arrays["priority"]
        if np.any(prios < 0):
            raise P.ProtocolError("priority update with negative values")
        applied = self.table.update_priorities(keys, prios)
        self.priority_updates += 1
        self.stale_priority_keys += len(keys) - applied

    def sample_batch(self) -> P.Message:
        rc = self.config.replay
        b = self.table.sample(rc.batch_size, self.rng)
        self.limiter.on_sample(rc.batch_size)
        return P.Message(
            P.BATCH,
            meta={"shard": self.id, "table_size": self.table.size},
            arrays={
                **b.items,
                "weight": b.weights.astype(np.float32),
                "key": b.keys.astype(np.int64),
            },
        )

    # --- loop -------------------------------------------------------------------------

    def _drain(self, channel: Any, handler: Any, limit: int, gate: Any = None) -> None:
        for _ in range(limit):
            if gate is not None and not gate():
                return
            got = channel.recv(block=False)
            if got is None:
                return
            try:
                handler(got[1])
            except (P.ProtocolError, ValueError) as exc:
                # A bad message from one actor must not stop the shard: count and drop it.
                channel.drop(got[1].sender or "?", str(exc))

    def can_insert(self) -> bool:
        """The rate limiter allows it and, for a FIFO table, the queue has room: a full queue
        holds the actors back (Reverb's Queue) instead of evicting items never sampled."""
        if not self.limiter.can_insert(1, self.size):
            return False
        if self.config.replay.table == "fifo":
            return self.size + self.last_insert <= self.table.capacity
        return True

    def teardown(self) -> None:
        if self.snapshot_path is not None:
            self.save_snapshot()

    def announce_incarnation(self) -> None:
        """Once a second, so that every actor hears it, also those that joined late or whose
        window is full of trajectories a dead incarnation of this shard held."""
        now = time.monotonic()
        if now < self.next_announce:
            return
        self.next_announce = now + INCARNATION_INTERVAL_S
        self.acks.send(
            P.Message(P.INCARNATION, meta={"incarnation": self.incarnation}),
            topic=P.incarnation_topic(self.id),
            block=False,
        )

    def step(self) -> None:
        rc = self.config.replay
        self.announce_incarnation()
        if not self.finish_snapshot(timeout=0.05):
            return  # the table stays still while its snapshot is written; tick() heartbeats
        if self.snapshot_path is not None and time.monotonic() >= self.next_snapshot:
            self.start_snapshot()
            return
        self._drain(self.priorities, self.on_learner_message, 64)
        self._drain(
            self.experience,
            self.on_experience,
            INSERTS_PER_STEP,
            gate=self.can_insert,
        )
        sent = 0
        while (
            sent < SAMPLES_PER_STEP
            and self.limiter.can_sample(rc.batch_size, self.size)
            and self.window_open()
        ):
            if not self.batches.sock.poll(0, zmq.POLLOUT):
                break
            if not self.batches.send(self.sample_batch(), block=False):
                break
            # Bounded: after a window reset the batches nobody acked stay until a later ack.
            if len(self.batch_sent_at) < 4 * rc.prefetch + 16:
                self.batch_sent_at[self.batches.next_seq - 1] = time.monotonic()
            sent += 1
            self.batches_sent += 1
        if sent:
            return
        # Nothing to send: wait for whatever can make progress.
        poller = zmq.Poller()
        poller.register(self.priorities.sock, zmq.POLLIN)
        if self.can_insert():
            poller.register(self.experience.sock, zmq.POLLIN)
        if self.limiter.can_sample(rc.batch_size, self.size) and self.window_open():
            poller.register(self.batches.sock, zmq.POLLOUT)
        poller.poll(50)

    def heartbeat_info(self) -> dict[str, Any]:
        rc = self.config.replay
        inserts, samples = self.limiter.inserts, self.limiter.samples
        info: dict[str, Any] = {
            "size": self.size,
            "capacity": self.table.capacity,
            "snapshots": self.snapshots,
            "snapshot_writing": self.snapshot_write is not None,
            "inserts": inserts,
            "samples": samples,
            "samples_per_insert": round(samples / inserts, 3) if inserts else 0.0,
            "trajectories": self.trajectories,
            "trajectories_received": self.trajectories_received,
            "steps_received": self.steps_received,
            "batches": self.batches_sent,
            "wire_bytes_batches": self.batches.stats.sent_bytes,
            "batches_in_flight": self.batches_in_flight,
            "batch_ack_timeouts": self.batch_ack_timeouts,
            "stale_priority_keys": self.stale_priority_keys,
            "layout_refused": self.layout_refused,
        }
        if self.snapshot_seconds is not None:
            info["snapshot_seconds"] = self.snapshot_seconds
        if self.snapshot_refused is not None:
            info["snapshot_refused"] = self.snapshot_refused
        if self.restored_items is not None:
            info["restored_items"] = self.restored_items
        blocked = self.limiter.why_blocked(rc.batch_size, self.size)
        if blocked:
            info["sampling_blocked"] = blocked
        if self.weights_versions:
            info["weights_version_seen"] = max(self.weights_versions)
        return info
