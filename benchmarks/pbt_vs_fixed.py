"""Population-based training against the same population with fixed hyperparameters, at equal
compute, on a task where the hyperparameter matters: CartPole PPO started from a learning rate
ten times too small.

Both arms run ``configs/cartpole_ppo.yaml`` with ``pbt.members`` members (one learner and one
actor each, every role its own process) for the same ``--seconds``, one after the other on the
same machine, every member starting from ``learner.lr = --lr``:

- **pbt**: the ``pbt`` role ranks the members every ``--ready`` seconds; the bottom quarter
  copies a top-quarter member's weights and optimizer state and explores its learning rate
  (x0.8 or x1.2, or with probability 0.25 a log-uniform draw in [1e-5, 1e-2]);
- **fixed**: the same roles, the ``pbt`` role included, with a ready interval longer than the
  run: no member ever exploits or explores.

A member's fitness is what PBT itself ranks by (``zrl.roles.pbt.member_fitness``): the mean
training episode return of its actors, read from the broker's STATUS every ``POLL_S``. The
benchmark prints, per arm, the best member's fitness at the end, the first time any member's
fitness reached ``--threshold``, the exploits, and each member's final learning rate, then one
JSON line.

    python benchmarks/pbt_vs_fixed.py                       # 4 members, 150 s per arm
    python benchmarks/pbt_vs_fixed.py --members 2 --seconds 90
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from zrl.config.experiment import load_config
from zrl.roles.pbt import member_fitness
from zrl.testing.processes import status_rows

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cartpole_ppo.yaml"
POLL_S = 2.0
NEVER_S = 86400
"""The fixed arm's ready interval (the most the config takes, a day): no round comes."""


def overrides(members: int, lr: float, ready: float, pbt: bool) -> list[str]:
    """The ``--set`` items of one arm."""
    return [
        f"pbt.members={members}",
        f"roles.learners={members}",
        f"roles.actors={members}",
        "roles.pbt=1",
        "roles.evaluator=0",
        f"learner.lr={lr}",
        f"pbt.ready_interval_s={ready if pbt else NEVER_S}",
        "pbt.min_episodes=5",
        f"checkpoint.interval={min(ready, 10)}",
        "stop.eval_return=null",
    ]


def run_arm(name: str, members: int, lr: float, ready: float, seconds: float) -> dict[str, Any]:
    """One ``zrl run`` of an arm; its members' fitness over time and its end state."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"zrl-pbt-{name}-")) / "run"
    cmd = [sys.executable, "-m", "zrl", "run", str(CONFIG), "--run-dir", str(run_dir)]
    for item in [*overrides(members, lr, ready, name == "pbt"), f"stop.wall_time={seconds}"]:
        cmd += ["--set", item]
    log = run_dir.parent / "run.log"
    ctx = zmq.Context()
    curve: list[tuple[float, dict[str, float]]] = []
    last_rows: dict[str, dict[str, Any]] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir.parent)
    started = time.monotonic()
    try:
        addr_file = run_dir / "broker_address"
        while not addr_file.exists() and proc.poll() is None:
            time.sleep(0.2)
        cfg = load_config(run_dir / "config.yaml") if (run_dir / "config.yaml").exists() else None
        addr = addr_file.read_text().strip() if addr_file.exists() else ""
        while proc.poll() is None and cfg is not None:
            rows = status_rows(ctx, addr)
            if rows:
                last_rows = rows
                fitness = member_fitness(list(rows.values()), cfg, cfg.pbt.min_episodes)
                if fitness:
                    curve.append((time.monotonic() - started, fitness))
            time.sleep(POLL_S)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        ctx.destroy(linger=0)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: zrl run exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    pbt_info = last_rows.get("pbt-0", {}).get("info", {})
    lrs = {
        f"member_{i}": last_rows.get(f"learner-{i}", {}).get("info", {}).get("hyperparameters")
        for i in range(members)
    }
    return {
        "curve": curve,
        "exploits": pbt_info.get("exploits", 0),
        "hyperparameters": lrs,
        "run_dir": str(run_dir),
    }


def summarize(arm: dict[str, Any], threshold: float) -> dict[str, Any]:
    """The best member's final fitness and the first time any member reached ``threshold``."""
    curve = arm["curve"]
    final = max(curve[-1][1].values()) if curve else float("nan")
    reached = next((t for t, f in curve if max(f.values()) >= threshold), None)
    return {
        "best_final_fitness": round(final, 1),
        "time_to_threshold_s": None if reached is None else round(reached, 1),
        "exploits": arm["exploits"],
        "hyperparameters": arm["hyperparameters"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=150.0, help="wall time of each arm")
    ap.add_argument("--lr", type=float, default=1e-4, help="every member's starting lr")
    ap.add_argument("--ready", type=float, default=15.0, help="PBT's ready interval (s)")
    ap.add_argument("--threshold", type=float, default=400.0, help="fitness to time")
    args = ap.parse_args()
    results = {}
    for name in ("fixed", "pbt"):
        arm = run_arm(name, args.members, args.lr, args.ready, args.seconds)
        results[name] = summarize(arm, args.threshold)
        print(f"{name}: {arm['run_dir']}", flush=True)
    print(
        f"\n{args.members} members, learner.lr {args.lr} at the start, {args.seconds:.0f} s per "
        f"arm, fitness = mean training episode return of a member's actors"
    )
    print(f"| arm | best member's final fitness | first at {args.threshold:.0f} | exploits |")
    print("|---|---|---|---|")
    for name, r in results.items():
        at = "not reached" if r["time_to_threshold_s"] is None else f"{r['time_to_threshold_s']} s"
        print(f"| {name} | {r['best_final_fitness']} | {at} | {r['exploits']} |")
    print(json.dumps({"members": args.members, "seconds": args.seconds, "lr": args.lr, **results}))


if __name__ == "__main__":
    main()
