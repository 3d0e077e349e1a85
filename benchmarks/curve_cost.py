"""What authentication costs: env steps/s of the same `zrl run` with its default keys (CURVE on
every socket) and with `--insecure` (no keys), in one process, runs alternating so that the
machine's load falls on both alike.

For each config: ``--rounds`` pairs of runs of ``--seconds`` each (the stop rule off); the
rate of a run is its env steps over its steady state (progress.csv from the first row past a
quarter of the run to the last); the ratio is keyed over insecure, median over the rounds.

    python benchmarks/curve_cost.py                          # Pong APPO and CartPole Ape-X
    python benchmarks/curve_cost.py --configs cartpole_apex_dqn.yaml --seconds 40 --rounds 1

Pong needs `pip install -e ".[atari]"`. docs/benchmarks.md has the figures measured here.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def steady_rate(progress: Path) -> float:
    """Env steps per second from the first row past a quarter of the run to the last."""
    rows = [(float(r["time"]), int(r["env_steps"])) for r in csv.DictReader(progress.open())]
    if len(rows) < 3:
        raise RuntimeError(f"{progress}: too few rows to measure ({len(rows)})")
    end_t, end_steps = rows[-1]
    start_t, start_steps = next(r for r in rows if r[0] >= rows[-1][0] / 4)
    if end_t <= start_t:
        raise RuntimeError(f"{progress}: no steady state to measure")
    return (end_steps - start_steps) / (end_t - start_t)


def one_run(config: str, seconds: int, insecure: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / config)]
        cmd += ["--run-dir", str(run_dir), "--set", f"stop.wall_time={seconds}"]
        cmd += ["--set", "stop.eval_return=null"] + (["--insecure"] if insecure else [])
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=seconds + 300)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-2000:]}")
        assert (run_dir / "keys").is_dir() != insecure, "the run's keys are not as asked"
        return steady_rate(run_dir / "progress.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["pong_appo.yaml", "cartpole_apex_dqn.yaml"])
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}, cores: {os.cpu_count()}")
    for config in args.configs:
        ratios = []
        for r in range(args.rounds):
            # Alternate which goes first: a trend in the machine's load favours neither.
            order = (False, True) if r % 2 == 0 else (True, False)
            rates = {insecure: one_run(config, args.seconds, insecure) for insecure in order}
            ratios.append(rates[False] / rates[True])
            print(
                f"{config} round {r + 1}: keyed {rates[False]:,.0f} env steps/s, "
                f"insecure {rates[True]:,.0f}/s, keyed/insecure {ratios[-1]:.3f}",
                flush=True,
            )
        print(
            f"{config}: keyed/insecure env steps/s, median of {len(ratios)}: "
            f"{statistics.median(ratios):.3f} (load now {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
