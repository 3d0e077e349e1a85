"""Time to solve CartPole-v1: zrl PPO, IMPALA and A3C against Stable-Baselines3 PPO, in one run.

For each seed: wall-clock seconds and env steps until the mean greedy return over 20
episodes reaches 475, measured from the moment the command is launched, for both: zrl is the
whole `zrl run` including process start-up; SB3 runs in a fresh Python process too (so both
pay for importing torch), with its blocking evaluations' time excluded (in SB3's favour; zrl's
evaluator runs alongside training and is not excluded). SB3's time from model construction
is printed as well. Runs are interleaved per seed
(sb3, ppo, impala, a3c) so load drifts hit every system alike. Prints the median of the seeds.

    python benchmarks/onpolicy_cartpole.py            # 3 seeds each
    python benchmarks/onpolicy_cartpole.py --seeds 1 --algos ppo --skip-sb3

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
TARGET = 475.0
EVAL_EPISODES = 20
EVAL_EVERY = 2048
SB3_BUDGET = 100_000
ALGOS = {"ppo": "zrl PPO", "impala": "zrl IMPALA", "a3c": "zrl A3C"}
SB3 = "SB3 PPO (zoo)"

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


def run_sb3(seed: int, limit: float) -> tuple[Result, float | None]:
    """SB3 in a fresh process, like `zrl run`: (seconds from launch, steps), and seconds from
    model construction."""
    t0 = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--sb3-worker",
            str(seed),
            "--limit",
            str(limit),
            "--launched",
            repr(t0),
        ],
        capture_output=True,
        text=True,
        timeout=limit + 120,
    )
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return (None, None), None
    return (out["from_launch"], out["steps"]), out["from_model"]


def sb3_worker(seed: int, limit: float, launched: float) -> None:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class EvalUntilSolved(BaseCallback):
        """Greedy 20-episode evaluation every 2048 env steps; its time is not counted."""

        def __init__(self) -> None:
            super().__init__()
            self.eval_env = gym.make("CartPole-v1")
            self.excluded = 0.0
            self.last_eval = 0
            self.solved_at: tuple[float, float, int] | None = None
            self.t0 = time.time()

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last_eval < EVAL_EVERY:
                return time.time() - self.t0 - self.excluded < limit
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
                now = time.time() - self.excluded
                self.solved_at = (now - launched, now - self.t0, self.num_timesteps)
                return False
            return time.time() - self.t0 - self.excluded < limit

    def linear(v: float):
        return lambda progress_remaining: progress_remaining * v

    # rl-baselines3-zoo hyperparameters for CartPole-v1 (hyperparams/ppo.yml).
    callback = EvalUntilSolved()
    model = PPO(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=8, seed=seed),
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        verbose=0,
    )
    model.learn(total_timesteps=SB3_BUDGET, callback=callback)
    solved = callback.solved_at or (None, None, None)
    print(json.dumps({"from_launch": solved[0], "from_model": solved[1], "steps": solved[2]}))


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
    parser.add_argument("--a3c-limit", type=float, default=600.0, help="seconds per A3C attempt")
    parser.add_argument("--algos", default="ppo,impala,a3c", help="comma-separated zrl algorithms")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--skip-zrl", action="store_true")
    parser.add_argument("--sb3-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_worker is not None:
        sb3_worker(args.sb3_worker, args.limit, args.launched or time.time())
        return
    algos = [] if args.skip_zrl else [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in ALGOS:
            parser.error(f"unknown algorithm {a!r}; choose from {','.join(ALGOS)}")

    results: dict[str, list[Result]] = {} if args.skip_sb3 else {SB3: []}
    results.update({ALGOS[a]: [] for a in algos})
    sb3_from_model: list[float | None] = []
    for seed in range(args.seeds):
        if not args.skip_sb3:
            r, from_model = run_sb3(seed, args.limit)
            results[SB3].append(r)
            sb3_from_model.append(from_model)
            print(
                f"seed {seed}: sb3     {r[0] and round(r[0], 1)} s, {r[1]} steps "
                f"({from_model and round(from_model, 1)} s from model construction)",
                flush=True,
            )
        for a in algos:
            limit = args.a3c_limit if a == "a3c" else args.limit
            r = run_zrl(seed, limit, REPO / "configs" / f"cartpole_{a}.yaml")
            results[ALGOS[a]].append(r)
            print(f"seed {seed}: {a:<7} {r[0] and round(r[0], 1)} s, {r[1]} steps", flush=True)

    print(
        f"\nCartPole-v1, mean greedy return over {EVAL_EPISODES} episodes >= {TARGET:.0f}, "
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
    if sb3_from_model:
        print(f"{'(SB3 from model)':<16} {fmt(sb3_from_model):>10}")
        report["sb3_seconds_from_model_construction"] = sb3_from_model
    print()
    for a in ("ppo", "impala"):
        if a in algos and not args.skip_sb3:
            zm, sm = median([r[0] for r in results[ALGOS[a]]]), median([r[0] for r in results[SB3]])
            ratio = zm / sm if math.isfinite(zm) and math.isfinite(sm) else None
            met = math.isfinite(zm) and zm < sm
            shown = f"{ratio:.2f}" if ratio is not None else "n/a"
            print(f"{a.upper()} vs SB3 PPO: ratio {shown}  target < 1: {'NOT ' * (not met)}MET")
            report[f"{a}_vs_sb3"] = {"ratio": ratio, "met": met}
    if "a3c" in algos:
        am = median([r[0] for r in results[ALGOS["a3c"]]])
        met = am <= args.a3c_limit
        print(f"A3C reached {TARGET:.0f} within {args.a3c_limit:.0f} s: {'yes' if met else 'no'}")
        report["a3c_within_limit"] = met
    print(json.dumps(report))


if __name__ == "__main__":
    main()
