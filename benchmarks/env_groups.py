"""Double-buffered sampling benchmark: actor env steps/s with ``actor.env_groups`` 1 vs 2.

The real ``Actor.setup`` + ``Actor.collect`` (sockets stubbed out, no broker) for
``configs/pong_appo.yaml`` (Pong via ale-py's AtariVectorEnv, Nature CNN, 1 torch thread,
``env.atari.num_threads`` as configured) with ``env.num_envs`` envs; the two actors live in one
process and run alternately, ``--reps`` times ``--seconds`` each, so load drifts on a shared
machine hit both alike. Steps are all agent steps collected (E x T per trajectory). Run from the
repo root::

    python benchmarks/env_groups.py --num-envs 8 --seconds 10 --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from zrl.config.experiment import config_from_dict
from zrl.roles.actor import Actor
from zrl.utils.runtime import limit_torch_threads

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pong_appo.yaml"


def bare_actor(num_envs: int, groups: int, overrides: list[str]) -> Any:
    cfg = config_from_dict(
        yaml.safe_load(CONFIG.read_text()),
        [f"env.num_envs={num_envs}", f"actor.env_groups={groups}", *overrides],
    )
    actor: Any = Actor("tcp://127.0.0.1:9", index=0)
    actor.config = cfg
    actor.open_push = actor.open_pull = lambda *a, **k: None
    actor.open_subscriber = actor.open_publisher = lambda *a, **k: None
    actor.lookup = lambda *a, **k: []
    actor.setup()
    return actor


def run(actor: Any, seconds: float) -> float:
    steps, t0 = 0, time.perf_counter()
    per = actor.num_envs * actor.config.actor.trajectory_length
    while time.perf_counter() - t0 < seconds:
        assert actor.collect() is not None
        steps += per
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="config override key=value")
    args = ap.parse_args()
    limit_torch_threads(1)
    actors = {g: bare_actor(args.num_envs, g, args.set) for g in (1, 2)}
    for a in actors.values():
        run(a, 1.0)  # warm-up
    rates: dict[int, list[float]] = {1: [], 2: []}
    print(f"load average before: {os.getloadavg()}")
    for rep in range(args.reps):
        for g, a in actors.items():
            rates[g].append(run(a, args.seconds))
            print(f"rep {rep} env_groups {g}: {rates[g][-1]:.0f} steps/s", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for g, r in rates.items():
        print(
            f"env_groups {g}: median {statistics.median(r):.0f} steps/s, "
            f"min {min(r):.0f}, max {max(r):.0f}"
        )
    print(f"ratio (2 / 1): {statistics.median(rates[2]) / statistics.median(rates[1]):.2f}")
    for a in actors.values():
        a.envs.close()


if __name__ == "__main__":
    main()
