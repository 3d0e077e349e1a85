"""A FIFO replay shard's CPU time per 1000 samples (issue 29): Pong APPO frame unrolls
(``frame_unroll`` trajectories of 8 envs x 32 steps, frames ``[8, 36, 84, 84]`` uint8) decoded
from their wire frames, assembled and inserted as ``ReplayServer.on_trajectory`` does, then
sampled 32 unrolls (1024 samples) at a time into BATCH messages and encoded for the wire, as
``ReplayServer.sample_batch`` does. No sockets: the shard's own work only. Inserts passed on
into the batch (``FifoQueue``'s way) against the same inserts written into the columns and
gathered out again (the way before), interleaved. Run from the repo root::

    python benchmarks/fifo_shard.py --batches 100 --repeats 7
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import gymnasium as gym
import numpy as np

from zrl.replay.assemble import assemble_items
from zrl.replay.layout import ExperienceLayout, experience_layout
from zrl.replay.tables import FifoQueue
from zrl.transport import protocol as P

E, T, K, HW, ACTIONS, BATCH = 8, 32, 4, 84, 6, 32


def trajectory_frames(rng: np.random.Generator, seq: int) -> list[bytes]:
    """One actor's ``frame_unroll`` TRAJECTORY as it arrives: its wire frames."""
    arrays = {
        "frames": rng.integers(0, 256, (E, T + K, HW, HW), dtype=np.uint8),
        "action": rng.integers(0, ACTIONS, (E, T)).astype(np.int64),
        "logp": np.full((E, T), math.log(1 / ACTIONS), np.float32),
        "reward": np.zeros((E, T), np.float32),
        "terminated": np.zeros((E, T), bool),
        "truncated": np.zeros((E, T), bool),
        "valid": np.ones((E, T), bool),
    }
    msg = P.Message(P.TRAJECTORY, meta={"weights_version": 1}, arrays=arrays, seq=seq)
    msg.sender = "actor-0"
    return [bytes(memoryview(f)) for f in P.encode(msg)]


def shard_cpu_ms(
    layout: ExperienceLayout, wire: list[list[bytes]], batches: int, through_columns: bool
) -> float:
    """CPU-ms per 1000 samples of ``batches`` batches through a FIFO queue; with
    ``through_columns`` each insert is written into the table's columns and each batch
    gathered out of them (what every FIFO shard did before inserts were passed on)."""
    table = FifoQueue(64)
    table.allocate(assemble_items(layout, layout.example(), 1, 0.99)[0])
    rng = np.random.default_rng(0)
    sent = samples = i = 0
    cpu0 = time.process_time()
    while sent < batches:
        msg = P.decode(wire[i % len(wire)])  # read-only views on the frames, as received
        i += 1
        layout.check(msg)
        items, _ = assemble_items(layout, msg, 1, 0.99)
        table.insert(items)
        if through_columns:
            table.write_held()
        if table.size >= BATCH:
            b = table.sample(BATCH, rng)
            out = P.Message(
                P.BATCH,
                meta={"shard": "replay-0", "table_size": table.size},
                arrays={**b.items, "weight": b.weights, "key": b.keys},
            )
            P.encode(out)
            samples += int(b.items["valid"].sum())
            sent += 1
    return (time.process_time() - cpu0) / samples * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    layout = experience_layout(
        "unroll",
        actions="discrete",
        observation_space=gym.spaces.Box(0, 255, (K, HW, HW), np.uint8),
        action_space=gym.spaces.Discrete(ACTIONS),
        num_envs=E,
        trajectory_length=T,
    )
    rng = np.random.default_rng(0)
    wire = [trajectory_frames(rng, i) for i in range(BATCH // E * 2)]  # reused round robin
    runs: dict[str, list[float]] = {"through the columns": [], "passed on": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        runs["through the columns"].append(shard_cpu_ms(layout, wire, args.batches, True))
        runs["passed on"].append(shard_cpu_ms(layout, wire, args.batches, False))
    print(
        f"FIFO shard, Pong APPO frame unrolls, batches of {BATCH} unrolls x {T} steps, "
        f"{args.repeats} x {args.batches} batches: CPU-ms per 1000 samples"
    )
    for name, values in runs.items():
        print(f"  {name:<20} min {min(values):.2f}  median {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
