"""The learner's CPU-seconds per 1000 samples on the CPU path (issue 29, g4): Pong APPO batches
(``frame_unroll_batch``: frames ``[32, 32 + 4, 84, 84]`` uint8, 1024 samples) encoded and
decoded as the wire carries them, then handed to the APPO update as the learner does
(``receive`` then ``train``), with the Nature CNN and ``configs/pong_appo.yaml``'s settings.
Run from the repo root::

    python benchmarks/learner_cpu.py --batches 12 --threads 1

Prints the process CPU time (all threads) and the wall time per 1000 samples, without the
first two batches (oneDNN builds its kernels then).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from zrl.algos.appo.update import AppoUpdate
from zrl.algos.models import experiment_model
from zrl.config.experiment import load_config
from zrl.nets.encoders import use_channels_last
from zrl.testing.fakes import learner_setup
from zrl.transport import protocol as P

E, T, K, HW, ACTIONS = 32, 32, 4, 84, 6
WARMUP = 2


def frame_batch(rng: np.random.Generator) -> P.Message:
    """One batch as a FIFO shard sends it, decoded from its wire frames as the learner gets
    it (read-only arrays over the received buffers)."""
    arrays = {
        "frames": rng.integers(0, 256, (E, T + K, HW, HW), dtype=np.uint8),
        "action": rng.integers(0, ACTIONS, (E, T)).astype(np.int64),
        "logp": np.full((E, T), math.log(1 / ACTIONS), np.float32),
        "reward": rng.choice(np.float32([-1, 0, 0, 0, 1]), (E, T)),
        "terminated": np.zeros((E, T), bool),
        "truncated": np.zeros((E, T), bool),
        "valid": np.ones((E, T), bool),
        "weights_version": np.zeros(E, np.int64),
        "weight": np.ones(E, np.float32),
        "key": np.arange(E, dtype=np.int64),
    }
    msg = P.Message(P.BATCH, meta={"shard": "replay-0", "table_size": 64}, arrays=arrays)
    return P.decode([bytes(memoryview(f)) for f in P.encode(msg)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(Path("configs/pong_appo.yaml"))
    obs_space = gym.spaces.Box(0, 255, (K, HW, HW), np.uint8)
    act_space = gym.spaces.Discrete(ACTIONS)
    torch.manual_seed(0)
    model = experiment_model(cfg, obs_space, act_space)
    use_channels_last(model)  # as the learner on a CPU (learner.memory_format: auto)
    setup = learner_setup(cfg, model, obs_space, act_space)
    update = AppoUpdate(setup)
    rng = np.random.default_rng(0)
    msgs = [frame_batch(rng) for _ in range(args.batches)]
    cpu = wall = 0.0
    samples = 0
    for i, msg in enumerate(msgs):
        c0, w0 = time.process_time(), time.perf_counter()
        update.receive(msg, 0)
        result = update.train(0)
        assert result is not None
        loss = float(result.loss)  # what the learner's heartbeat reads, once a second at most
        if i >= WARMUP:
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            samples += result.samples
    print(
        f"APPO learner, CPU path, {samples} samples in {args.batches - WARMUP} batches of "
        f"{E}x{T}, torch threads {args.threads}: {cpu / samples * 1e3:.3f} CPU-s and "
        f"{wall / samples * 1e3:.3f} wall-s per 1000 samples (last loss {loss:.4f})"
    )


if __name__ == "__main__":
    main()
