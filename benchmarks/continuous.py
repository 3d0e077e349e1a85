"""Time to -200 on Pendulum-v1: zrl Ape-X DDPG and SAC against Stable-Baselines3 SAC, in one run.

For each seed: wall-clock seconds and env steps until the mean greedy return over 10
episodes reaches -200, measured from the moment the command is launched (zrl: the whole
`zrl run` including process start-up; SB3: from model construction, with its evaluation
time excluded — a conservative choice in SB3's favour). SB3 SAC uses rl-baselines3-zoo's
Pendulum-v1 hyperparameters (hyperparams/sac.yml: learning_rate 1e-3, 20k steps, SB3's
defaults otherwise) and is evaluated every 1000 env steps. Runs are interleaved per seed
(sb3, sac, ddpg) so load drifts hit every system alike. Prints the median of the seeds and a
final JSON line.

    python benchmarks/continuous.py            # 3 seeds each
    python benchmarks/continuous.py --seeds 1 --algos sac --skip-sb3

SB3 is an optional dependency: pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "Pendulum-v1"
TARGET = -200.0
EVAL_EPISODES = 10
EVAL_EVERY = 1000
SB3_BUDGET = 20_000  # the zoo's n_timesteps; training continues past it until the limit
ALGOS = {"sac": "zrl SAC", "apex_ddpg": "zrl Ape-X DDPG"}
CONFIGS = {"sac": "pendulum_sac.yaml", "apex_ddpg": "pendulum_apex_ddpg.yaml"}
SB3 = "SB3 SAC (zoo)"

Result = tuple[float | None, int | None]


def run_zrl(seed: int, limit: float, config: Path) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.time()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "zrl",
                "run",
                str(config),
                "--run-dir",
                str(run_dir),
                "--set",
                f"seed={seed}",
                "--set",
                f"stop.wall_time={limit}",
                "--set",
                f"stop.eval_return={TARGET}",
                "--set",
                f"evaluator.episodes={EVAL_EPISODES}",
                # The baseline stops on one evaluation at the target: the same criterion here.
                "--set",
                "stop.eval_window=1",
            ],
            capture_output=True,
            text=True,
            timeout=limit + 120,
        )
        summary_path = run_dir / "summary.json"
        if not summary_path.is_file():
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return None, None
        summary = json.loads(summary_path.read_text())
        if not summary["reached_target"]:
            return None, summary.get("env_steps")
        return summary["target_reached_at"] - t0, summary["env_steps_to_target"]


def run_sb3(seed: int, limit: float) -> Result:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)

    class EvalUntilSolved(BaseCallback):
        """Greedy 10-episode evaluation every 1000 env steps; its time is not counted."""

        def __init__(self) -> None:
            super().__init__()
            self.eval_env = gym.make(ENV_ID)
            self.excluded = 0.0
            self.last_eval = 0
            self.solved_at: Result | None = None
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last_eval < EVAL_EVERY:
                return time.perf_counter() - self.t0 - self.excluded < limit
            self.last_eval = self.num_timesteps
            start = time.perf_counter()
            returns = []
            for ep in range(EVAL_EPISODES):
                obs, _ = self.eval_env.reset(seed=10_000 * seed + ep)
                done, total = False, 0.0
                while not done:
                    action, _ = self.model.predict(obs, deterministic=True)
                    obs, r, term, trunc, _ = self.eval_env.step(action)
                    total += float(r)
                    done = term or trunc
                returns.append(total)
            self.excluded += time.perf_counter() - start
            if np.mean(returns) >= TARGET:
                self.solved_at = (time.perf_counter() - self.t0 - self.excluded, self.num_timesteps)
                return False
            return time.perf_counter() - self.t0 - self.excluded < limit

    # rl-baselines3-zoo hyperparameters for Pendulum-v1 (hyperparams/sac.yml).
    callback = EvalUntilSolved()
    model = SAC("MlpPolicy", gym.make(ENV_ID), learning_rate=1e-3, seed=seed, verbose=0)
    model.learn(total_timesteps=SB3_BUDGET, callback=callback)
    if callback.solved_at is None:
        model.learn(total_timesteps=10_000_000, callback=callback, reset_num_timesteps=False)
    return callback.solved_at or (None, None)


def median(values: list[float | None]) -> float:
    return statistics.median([v if v is not None else math.inf for v in values])


def finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def fmt(values: list[float | None]) -> str:
    solved = [v for v in values if v is not None]
    if not solved:
        return "not solved"
    return f"{median(values):8.1f}" + (
        "" if len(solved) == len(values) else f" ({len(solved)}/{len(values)} solved)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per attempt")
    parser.add_argument("--algos", default="sac,apex_ddpg", help="comma-separated zrl algorithms")
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in ALGOS:
            parser.error(f"unknown algorithm {a!r}; choose from {','.join(ALGOS)}")

    results: dict[str, list[Result]] = {} if args.skip_sb3 else {SB3: []}
    results.update({ALGOS[a]: [] for a in algos})
    for seed in range(args.seeds):
        if not args.skip_sb3:
            r = run_sb3(seed, args.limit)
            results[SB3].append(r)
            print(f"seed {seed}: sb3 sac   {r[0] and round(r[0], 1)} s, {r[1]} steps", flush=True)
        for a in algos:
            r = run_zrl(seed, args.limit, REPO / "configs" / CONFIGS[a])
            results[ALGOS[a]].append(r)
            print(f"seed {seed}: {a:<9} {r[0] and round(r[0], 1)} s, {r[1]} steps", flush=True)

    print(
        f"\n{ENV_ID}, mean greedy return over {EVAL_EPISODES} episodes >= {TARGET:.0f}, "
        f"median of {args.seeds} seeds"
    )
    print(f"{'system':<16} {'seconds':>10} {'env steps':>12}")
    for name, rs in results.items():
        secs = fmt([r[0] for r in rs])
        steps = fmt([float(r[1]) if r[0] is not None and r[1] is not None else None for r in rs])
        print(f"{name:<16} {secs:>10} {steps:>12}")

    report: dict[str, object] = {
        name: {
            "seconds": [r[0] for r in rs],
            "env_steps": [r[1] for r in rs],
            "median_seconds": finite(median([r[0] for r in rs])),
            "median_env_steps": finite(median([r[1] if r[0] is not None else None for r in rs])),
        }
        for name, rs in results.items()
    }
    print()
    if "sac" in algos and not args.skip_sb3:
        zm, sm = median([r[0] for r in results[ALGOS["sac"]]]), median([r[0] for r in results[SB3]])
        ratio = zm / sm if math.isfinite(zm) and math.isfinite(sm) else None
        met = math.isfinite(zm) and zm < sm
        shown = f"{ratio:.2f}" if ratio is not None else "n/a"
        print(f"zrl SAC vs SB3 SAC wall-clock: ratio {shown}  target < 1: {'NOT ' * (not met)}MET")
        report["sac_vs_sb3"] = {"ratio": ratio, "met": met}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
