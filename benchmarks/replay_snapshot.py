"""A replay shard's snapshot of a full table: how long its loop goes without a turn (and so
without a heartbeat) while the snapshot is written, the way a shard does it now (a thread
writing views of the table, ``zrl.replay.snapshot.BackgroundSave``, while the loop turns every
50 ms) against the way before (a copy of the table's rows, written in the loop). The table is
SAC's on Humanoid-v5 by default: 1M transitions of 348 float32 observations (2.9 GB). Needs
about twice the table's size in free memory (the copies of the old way) and on the disk. Run
from the repo root::

    python benchmarks/replay_snapshot.py                       # 1M x 348: Humanoid SAC
    python benchmarks/replay_snapshot.py --rows 200000 --obs 17

Prints each way's figures and the ratio of the loop's longest gap (before / now); the
broker marks a role dead after ``broker.heartbeat_timeout`` (3 s) without a heartbeat.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from zrl.replay.snapshot import BackgroundSave, save_state
from zrl.replay.tables import Table, make_table

CHUNK = 50_000
LOOP_WAIT_S = 0.05  # what ReplayServer.step waits on the writer each turn


def full_table(rows: int, obs: int, actions: int) -> Table:
    table = make_table("uniform", rows)
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        table.insert(
            {
                "obs": np.full((n, obs), start, np.float32),
                "next_obs": np.full((n, obs), start + 1, np.float32),
                "action": np.zeros((n, actions), np.float32),
                "reward": np.zeros(n, np.float32),
                "discount": np.ones(n, np.float32),
            }
        )
    return table


def in_the_loop(table: Table, path: Path) -> dict[str, float]:
    """The way before: a copy of the rows, written by the loop itself (no turn meanwhile)."""
    started = time.monotonic()
    save_state(path, {"table": table.state_dict()})
    seconds = time.monotonic() - started
    return {"write_s": round(seconds, 2), "longest_gap_s": round(seconds, 3)}


def in_a_thread(table: Table, path: Path) -> dict[str, float]:
    """Now: views of the table written in a thread while the loop turns."""
    write = BackgroundSave(path, {"table": table.state_dict(copy=False)})
    gaps, last = [], time.monotonic()
    while not write.done(LOOP_WAIT_S):
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    gaps.append(time.monotonic() - last)
    if write.error is not None:
        raise write.error
    return {"write_s": round(write.seconds or 0.0, 2), "longest_gap_s": round(max(gaps), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="transitions in the table")
    ap.add_argument("--obs", type=int, default=348, help="observation size (Humanoid-v5: 348)")
    ap.add_argument("--actions", type=int, default=17, help="action size (Humanoid-v5: 17)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    print(f"filling a table of {args.rows:,} transitions ({args.obs} observations) ...", flush=True)
    table = full_table(args.rows, args.obs, args.actions)
    print(f"table: {table.nbytes / 1e9:.2f} GB", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Alternated, so that neither way alone meets a cold page cache.
        now = in_a_thread(table, Path(tmp) / "now.snapshot")
        print(f"now (a thread, views):       {now}", flush=True)
        before = in_the_loop(table, Path(tmp) / "before.snapshot")
        print(f"before (the loop, copies):   {before}", flush=True)
        size = (Path(tmp) / "now.snapshot").stat().st_size
    ratio = before["longest_gap_s"] / max(now["longest_gap_s"], 1e-3)
    print(
        f"the loop's longest gap: {before['longest_gap_s']:.2f} s before, "
        f"{now['longest_gap_s']:.3f} s now ({ratio:.0f}x shorter)"
    )
    print(
        json.dumps(
            {
                "table_bytes": table.nbytes,
                "file_bytes": size,
                "now": now,
                "before": before,
                "gap_ratio": round(ratio, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
