"""The README's headline, over seeds: `zrl run configs/cartpole_apex_dqn.yaml` as the README
writes it (only ``seed`` set, and a run directory), beside ``--load`` busy loops.

For each seed: whether the run met its stop rule (the config's own: the mean of the last three
evaluations reaches 475), the seconds from the command to the target (the summary's
``seconds_to_target``) and to the end of the command, the env steps, and the highest load
average seen. Prints how many seeds met the rule within ``--within`` seconds (the README's
figure), and the median and worst times.

    python benchmarks/readme_cartpole.py --seeds 10 --load 1 --within 180
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
BUSY = "while True: pass"


def one_seed(seed: int, limit: int) -> dict:
    """One README run of ``seed``, ended by the config's stop rule or ``limit`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "zrl", "run", str(CONFIG), "--run-dir", str(run_dir)]
        cmd += ["--set", f"seed={seed}", "--set", f"stop.wall_time={limit}"]
        started, loads = time.monotonic(), []
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp)
        while proc.poll() is None:
            loads.append(os.getloadavg()[0])
            time.sleep(2)
        took = time.monotonic() - started
        summary = json.loads((run_dir / "summary.json").read_text())
        return {
            "seed": seed,
            "met": bool(summary["reached_target"]),
            "to_target_s": summary["seconds_to_target"],
            "command_s": round(took, 1),
            "env_steps": summary["env_steps_to_target"] or summary["env_steps"],
            "first_env_step_s": summary["seconds_to_first_env_step"],
            "load": round(max(loads, default=0.0), 1),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--load", type=int, default=1, help="busy loops beside every run")
    ap.add_argument("--within", type=float, default=180.0, help="the README's seconds")
    ap.add_argument("--limit", type=int, default=600, help="a run's stop.wall_time")
    ap.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, {args.load} busy loops beside each run", flush=True)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.load)]
    rows = []
    try:
        for seed in range(args.seeds):
            row = one_seed(seed, args.limit)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    times = [r["to_target_s"] if r["met"] else float("inf") for r in rows]
    within = sum(t <= args.within for t in times)
    print(
        f"{within} of {len(rows)} seeds met the stop rule within {args.within:.0f} s; "
        f"median {statistics.median(times):.1f} s, worst {max(times):.1f} s to the target; "
        f"load average up to {max(r['load'] for r in rows):.1f}"
    )


if __name__ == "__main__":
    main()
