"""Replay table throughput benchmark.

Measures, at full capacity, what an Ape-X style replay server spends its time on: inserting
actor chunks, sampling learner batches and applying the learner's priority updates. Run from
the repo root::

    python benchmarks/replay.py --capacity 1000000 --batch 256 --seconds 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from zrl.replay.tables import PrioritizedTable, Table, make_table

CHUNK = 256  # transitions per actor insert
TARGET_MS = 1.0  # prioritized sample of one batch


def make_chunks(rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    """A pool of CartPole-like chunks, generated up front so the timed loops time the table."""
    chunks: list[dict[str, np.ndarray]] = []
    for _ in range(count):
        obs = rng.standard_normal((CHUNK, 4)).astype(np.float32)
        chunks.append(
            {
                "obs": obs,
                "action": rng.integers(0, 2, CHUNK, dtype=np.int64),
                "reward": np.ones(CHUNK, dtype=np.float32),
                "discount": np.full(CHUNK, 0.99, dtype=np.float32),
                "next_obs": obs + 0.01,
            }
        )
    return chunks


def time_calls(fn: Callable[[int], object], seconds: float) -> np.ndarray:
    """Call fn(i) repeatedly for about ``seconds``; return per-call durations in seconds."""
    durations = []
    deadline = time.perf_counter() + seconds
    i = 0
    while True:
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        durations.append(t1 - t0)
        i += 1
        if t1 >= deadline:
            return np.array(durations)


def fill(table: Table, chunks: list[dict[str, np.ndarray]]) -> float:
    t0 = time.perf_counter()
    i = 0
    while table.size < table.capacity:
        table.insert(chunks[i % len(chunks)])
        i += 1
    return time.perf_counter() - t0


Row = tuple[str, float, np.ndarray, np.ndarray, np.ndarray | None]


def bench(
    kind: str,
    args: argparse.Namespace,
    chunks: list[dict[str, np.ndarray]],
    rng: np.random.Generator,
) -> Row:
    """Fill a table, then time inserts, samples and (if prioritized) priority updates."""
    table = make_table(kind, args.capacity)
    fill_s = fill(table, chunks)
    ins = time_calls(lambda i: table.insert(chunks[i % len(chunks)]), args.seconds)
    smp = time_calls(lambda i: table.sample(args.batch, rng), args.seconds)
    upd = None
    if isinstance(table, PrioritizedTable):
        # keys from real samples, so updates hit the same mix of leaves a learner would
        keys = [table.sample(args.batch, rng).keys for _ in range(32)]
        pris = [rng.exponential(1.0, args.batch) for _ in range(32)]
        upd = time_calls(
            lambda i: table.update_priorities(keys[i % 32], pris[i % 32]), args.seconds
        )
    return kind, fill_s, ins, smp, upd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.capacity < 1 or args.batch < 1 or args.seconds <= 0:
        parser.error(f"need capacity >= 1, batch >= 1, seconds > 0, got {vars(args)}")

    rng = np.random.default_rng(args.seed)
    chunks = make_chunks(rng, 32)
    print(
        f"capacity={args.capacity:,} batch={args.batch} insert chunk={CHUNK} "
        f"seconds/measurement={args.seconds:g}"
    )

    rows = [bench(kind, args, chunks, rng) for kind in ("uniform", "prioritized")]

    header = (
        f"{'table':<12}{'fill s':>8}{'insert items/s':>16}{'sample items/s':>16}"
        f"{'sample mean ms':>16}{'sample p99 ms':>15}{'update mean ms':>16}{'update p99 ms':>15}"
    )
    print(header)
    print("-" * len(header))
    for kind, fill_s, ins, smp, upd in rows:
        upd_mean = f"{upd.mean() * 1e3:.3f}" if upd is not None else "-"
        upd_p99 = f"{np.percentile(upd, 99) * 1e3:.3f}" if upd is not None else "-"
        print(
            f"{kind:<12}{fill_s:>8.2f}{CHUNK * len(ins) / ins.sum():>16,.0f}"
            f"{args.batch * len(smp) / smp.sum():>16,.0f}"
            f"{smp.mean() * 1e3:>16.3f}{np.percentile(smp, 99) * 1e3:>15.3f}"
            f"{upd_mean:>16}{upd_p99:>15}"
        )

    smp = rows[1][3]
    mean_ms, p99_ms = smp.mean() * 1e3, np.percentile(smp, 99) * 1e3
    verdict = "MET" if mean_ms < TARGET_MS else "NOT MET"
    print(
        f"target: prioritized sample of batch {args.batch} < {TARGET_MS:g} ms -> {verdict} "
        f"(mean {mean_ms:.3f} ms, p99 {p99_ms:.3f} ms)"
    )


if __name__ == "__main__":
    main()
