"""Load slows learning, it does not break it: the env steps a run needs to reach its target on
a quiet machine and beside a load generator (busy loops, one per ``--load`` unit), measured in
one process, the quiet run first. Also counts the roles the broker marked dead or stalled.

    python benchmarks/under_load.py                                  # load 20, two configs
    python benchmarks/under_load.py --configs pendulum_appo.yaml --load 10
    python benchmarks/under_load.py --configs pong_appo.yaml:300 --loaded-only   # liveness
    python benchmarks/under_load.py --configs pendulum_appo.yaml --keep runs/ul  # keep the logs
    python benchmarks/under_load.py --configs cartpole_apex_dqn.yaml:1800 --seeds 1 2 3

A config may carry its own wall time (``NAME:SECONDS``). Prints, per config: env steps to the
target quiet and loaded, their ratio (the bar: at most 1.5; the loaded run stops there, so a
miss costs no more than the bar), wall times, dead and stalled markings, and the load average
the loaded run saw; ``--out FILE`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"
BAR = 1.5
"""The loaded run reaches the target within this many times the quiet run's env steps."""


def one_run(
    config: str,
    wall_time: int,
    load: int,
    env_steps: int | None = None,
    keep: Path | None = None,
    seed: int | None = None,
) -> dict:
    """One `zrl run` to its config's target (or ``wall_time``, or ``env_steps``) beside
    ``load`` busy loops; its run directory, less the checkpoints, copied under ``keep``."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / config)]
            cmd += ["--run-dir", str(run_dir), "--set", f"stop.wall_time={wall_time}"]
            if env_steps is not None:
                cmd += ["--set", f"stop.env_steps={env_steps}"]
            if seed is not None:
                cmd += ["--set", f"seed={seed}"]
            t0, loads = time.monotonic(), []
            proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp
            )
            while proc.poll() is None:
                loads.append(os.getloadavg()[0])
                time.sleep(5)
            if keep is not None:
                dest = keep / (f"{Path(config).stem}-load{load}" + (f"-seed{seed}" if seed else ""))
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("checkpoints"))
            summary = json.loads((run_dir / "summary.json").read_text())
            broker_log = (run_dir / "logs" / "broker.log").read_text(errors="replace")
            lines = broker_log.splitlines()
            deaths = [line for line in lines if line.rstrip().endswith(": marked dead")]
            return {
                "config": config,
                "seed": seed,
                "load_units": load,
                "reached": summary["reached_target"],
                "steps": summary.get("env_steps_to_target") or summary["env_steps"],
                "env_steps": summary["env_steps"],
                "wall": round(time.monotonic() - t0, 1),
                "dead": len(deaths),
                "dead_lines": deaths[:20],  # which role, which host, how long it was silent
                "stalled": broker_log.count(": stalled"),
                "restarts": summary.get("restarts"),
                # What a miss needs explained: how far it got, what the actors' steps came to.
                "best_eval_return": summary.get("best_eval_return"),
                "updates": summary.get("updates"),
                "experience": summary.get("experience"),
                "load": round(max(loads, default=0.0), 1),
            }
    finally:
        for p in busy:
            p.kill()
            p.wait()


def describe(r: dict) -> str:
    return (
        f"{r['steps']:,} env steps ({r['wall']:.0f} s, reached {r['reached']}, "
        f"best {r['best_eval_return']}, {r['updates']} updates, "
        f"{r['dead']} marked dead, {r['stalled']} stalled, restarts {r['restarts']}, "
        f"load up to {r['load']:.1f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs", nargs="+", default=["pendulum_appo.yaml", "cartpole_apex_dqn.yaml"]
    )
    ap.add_argument("--load", type=int, default=20, help="busy loops beside the loaded run")
    ap.add_argument("--wall-time", type=int, default=900, help="for configs without :SECONDS")
    ap.add_argument("--loaded-only", action="store_true", help="skip the quiet runs")
    ap.add_argument("--out", type=Path, help="write every run's row here as JSON")
    ap.add_argument(
        "--keep", type=Path, help="copy each run's directory (logs, eval.csv) under this one"
    )
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[None],
        help="run each config with each of these seeds (quiet, then loaded, per seed)",
    )
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for spec, seed in [(spec, seed) for spec in args.configs for seed in args.seeds]:
        config, _, wall = spec.partition(":")
        wall_time = int(wall) if wall else args.wall_time
        quiet = (
            None if args.loaded_only else one_run(config, wall_time, 0, keep=args.keep, seed=seed)
        )
        # The bar ends the loaded run: it reaches the target within 1.5x the quiet run's env
        # steps, or it does not (its wall time grows with the load, and is only a guard).
        cap = math.ceil(BAR * quiet["steps"]) if quiet and quiet["reached"] else None
        loaded = one_run(config, wall_time, args.load, env_steps=cap, keep=args.keep, seed=seed)
        rows += [r for r in (quiet, loaded) if r]
        parts = [f"beside {args.load} busy loops {describe(loaded)}"]
        if quiet:
            ratio = loaded["steps"] / quiet["steps"] if quiet["steps"] else float("nan")
            verdict = "met" if quiet["reached"] and loaded["reached"] else "missed"
            parts = [
                f"quiet {describe(quiet)}",
                *parts,
                f"loaded/quiet env steps {ratio:.2f} (bar {BAR}: {verdict})",
            ]
        name = config if seed is None else f"{config} seed {seed}"
        print(f"{name}: " + "; ".join(parts), flush=True)
        for r in (quiet, loaded):
            for line in (r or {}).get("dead_lines", []):
                print(f"  {'quiet' if r is quiet else 'loaded'}: {line}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
