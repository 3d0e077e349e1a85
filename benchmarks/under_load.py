"""Load slows learning, it does not break it: the env steps a run needs to reach its target on
a quiet machine and beside a load generator (busy loops, one per ``--load`` unit), measured in
one process, the quiet run first. Also counts the roles the broker marked dead in each run.

    python benchmarks/under_load.py                                  # load 20, two configs
    python benchmarks/under_load.py --configs pendulum_appo.yaml --load 10

Prints, per config: env steps to the target quiet and loaded, their ratio (the issue's bar:
at most 1.5), wall times, dead-markings, and the load average the loaded run saw.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"


def one_run(config: str, wall_time: int, load: int) -> dict:
    """One `zrl run` to its config's target (or ``wall_time``) beside ``load`` busy loops."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / config)]
            cmd += ["--run-dir", str(run_dir), "--set", f"stop.wall_time={wall_time}"]
            t0, loads = time.monotonic(), []
            proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp
            )
            while proc.poll() is None:
                loads.append(os.getloadavg()[0])
                time.sleep(5)
            summary = json.loads((run_dir / "summary.json").read_text())
            broker_log = (run_dir / "logs" / "broker.log").read_text(errors="replace")
            return {
                "reached": summary["reached_target"],
                "steps": summary.get("env_steps_to_target") or summary["env_steps"],
                "wall": time.monotonic() - t0,
                "dead": broker_log.count("marked dead"),
                "load": max(loads, default=0.0),
            }
    finally:
        for p in busy:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs", nargs="+", default=["pendulum_appo.yaml", "cartpole_apex_dqn.yaml"]
    )
    ap.add_argument("--load", type=int, default=20, help="busy loops beside the loaded run")
    ap.add_argument("--wall-time", type=int, default=900)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}")
    for config in args.configs:
        quiet = one_run(config, args.wall_time, 0)
        loaded = one_run(config, args.wall_time, args.load)
        ratio = loaded["steps"] / quiet["steps"] if quiet["steps"] else float("nan")
        print(
            f"{config}: quiet {quiet['steps']:,} env steps ({quiet['wall']:.0f} s, reached "
            f"{quiet['reached']}, {quiet['dead']} marked dead); beside {args.load} busy loops "
            f"(load up to {loaded['load']:.1f}) {loaded['steps']:,} env steps "
            f"({loaded['wall']:.0f} s, reached {loaded['reached']}, {loaded['dead']} marked "
            f"dead); loaded/quiet env steps {ratio:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
