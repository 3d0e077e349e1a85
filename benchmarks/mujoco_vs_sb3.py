"""MuJoCo HalfCheetah-v5 and Hopper-v5: zrl PPO against Stable-Baselines3 PPO, in one run.

For each env, each system trains for the same wall-clock budget (``--seconds``, counted from
the launch: zrl's whole ``zrl run`` with its process start-up; SB3 from model construction,
its evaluation time excluded, in SB3's favour), one after the other on the same machine. Both
are then judged the same way: the mean return of ``--episodes`` greedy episodes of the final
policy (zrl: ``model_last.pt`` through ``zrl eval``; SB3: ``deterministic=True`` with its
observation normalization frozen), plus the env steps each made and, from the evaluations
along the way (zrl: eval.csv, every ``evaluator.interval`` s; SB3: every ``EVAL_EVERY`` env
steps, 5 episodes), the seconds to the first evaluation at ``THRESHOLDS``.

- zrl: ``configs/halfcheetah_ppo.yaml`` and ``configs/hopper_ppo.yaml`` (CleanRL's
  ppo_continuous_action.py hyperparameters).
- SB3 PPO: rl-baselines3-zoo's hyperparameters for these envs (hyperparams/ppo.yml,
  ``ZOO`` below: VecNormalize on observations and rewards, one env, a 256x256 ReLU MLP with
  ``log_std_init=-2``), torch on one thread as zrl's learner.

    pip install -e ".[mujoco,bench]"
    python benchmarks/mujoco_vs_sb3.py                          # both envs, 300 s each system
    python benchmarks/mujoco_vs_sb3.py --envs hopper --seconds 120

Prints a table per env and a final JSON line. The CleanRL curves (1M steps) are the reference
for what returns at a given step count should be; 300 s on 2 cores is ~100-300k steps.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zrl.testing.processes import zrl_run_command

REPO = Path(__file__).resolve().parents[1]
ENVS = {
    "halfcheetah": ("HalfCheetah-v5", "halfcheetah_ppo.yaml"),
    "hopper": ("Hopper-v5", "hopper_ppo.yaml"),
}
THRESHOLDS = {"halfcheetah": 1000.0, "hopper": 1000.0}
EVAL_EVERY = 10_000
ZOO: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo hyperparams/ppo.yml (HalfCheetah-v4 / Hopper-v4 entries).
    "halfcheetah": {
        "batch_size": 64,
        "n_steps": 512,
        "gamma": 0.98,
        "learning_rate": 2.0633e-05,
        "ent_coef": 0.000401762,
        "clip_range": 0.1,
        "n_epochs": 20,
        "gae_lambda": 0.92,
        "max_grad_norm": 0.8,
        "vf_coef": 0.58096,
    },
    "hopper": {
        "batch_size": 32,
        "n_steps": 512,
        "gamma": 0.999,
        "learning_rate": 9.80828e-05,
        "ent_coef": 0.00229519,
        "clip_range": 0.2,
        "n_epochs": 5,
        "gae_lambda": 0.99,
        "max_grad_norm": 0.7,
        "vf_coef": 0.835671,
    },
}


def first_at(points: list[tuple[float, float]], threshold: float) -> float | None:
    """The time of the first (time, return) point at or above ``threshold``; None if none."""
    return next((t for t, r in points if r >= threshold), None)


def run_zrl(env: str, seconds: float, episodes: int, seed: int) -> dict[str, Any]:
    env_id, config = ENVS[env]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.monotonic()
        subprocess.run(
            zrl_run_command(
                REPO / "configs" / config,
                run_dir,
                [f"seed={seed}", f"stop.wall_time={seconds}", "stop.eval_return=null"],
            ),
            capture_output=True,
            text=True,
            timeout=seconds + 300,
            check=False,
            cwd=tmp,
        )
        launch = time.monotonic() - t0
        summary = json.loads((run_dir / "summary.json").read_text())
        with open(run_dir / "eval.csv", newline="") as f:
            points = [(float(r["time"]), float(r["mean"])) for r in csv.DictReader(f)]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "zrl",
                "eval",
                str(run_dir),
                "-n",
                str(episodes),
                "--model",
                "model_last.pt",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
            cwd=tmp,
        )
    # `zrl eval` ends with "mean M +- S over N episodes".
    mean = next(
        float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("mean ")
    )
    return {
        "final_return": mean,
        "env_steps": summary["env_steps"],
        "seconds": round(launch, 1),
        "to_threshold_s": first_at(points, THRESHOLDS[env]),
        "evaluations": points,
        "env": env_id,
    }


def run_sb3(env: str, seconds: float, episodes: int, seed: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    env_id = ENVS[env][0]

    def greedy(model: Any, norm: VecNormalize, n: int, base: int) -> float:
        env1 = gym.make(env_id)
        total = []
        for ep in range(n):
            obs, _ = env1.reset(seed=base + ep)
            done, ret = False, 0.0
            while not done:
                action, _ = model.predict(norm.normalize_obs(obs), deterministic=True)
                obs, r, term, trunc, _ = env1.step(action)
                ret += float(r)
                done = term or trunc
            total.append(ret)
        env1.close()
        return float(np.mean(total))

    class Budget(BaseCallback):
        """Stops at the wall-clock budget; evaluates every EVAL_EVERY steps, untimed."""

        def __init__(self) -> None:
            super().__init__()
            self.t0 = time.monotonic()
            self.excluded = 0.0
            self.last = 0
            self.points: list[tuple[float, float]] = []

        def elapsed(self) -> float:
            return time.monotonic() - self.t0 - self.excluded

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last >= EVAL_EVERY:
                self.last = self.num_timesteps
                start = time.monotonic()
                ret = greedy(self.model, vec, 5, 1_000_000 + self.num_timesteps)
                self.excluded += time.monotonic() - start
                self.points.append((round(self.elapsed(), 1), ret))
            return self.elapsed() < seconds

    vec = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed))
    policy_kwargs = {
        "log_std_init": -2,
        "ortho_init": False,
        "activation_fn": torch.nn.ReLU,
        "net_arch": {"pi": [256, 256], "vf": [256, 256]},
    }
    budget = Budget()
    model = PPO("MlpPolicy", vec, seed=seed, verbose=0, policy_kwargs=policy_kwargs, **ZOO[env])
    model.learn(total_timesteps=100_000_000, callback=budget)
    vec.training = False
    return {
        "final_return": greedy(model, vec, episodes, 2_000_000),
        "env_steps": int(model.num_timesteps),
        "seconds": round(budget.elapsed(), 1),
        "to_threshold_s": first_at(budget.points, THRESHOLDS[env]),
        "evaluations": budget.points,
        "env": env_id,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="halfcheetah,hopper")
    parser.add_argument("--seconds", type=float, default=300.0, help="wall clock per system")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    for e in envs:
        if e not in ENVS:
            parser.error(f"unknown env {e!r}; choose from {','.join(ENVS)}")
    report: dict[str, Any] = {}
    for env in envs:
        rows = {
            "SB3 PPO (zoo)": run_sb3(env, args.seconds, args.episodes, args.seed),
            "zrl PPO": run_zrl(env, args.seconds, args.episodes, args.seed),
        }
        print(
            f"\n{ENVS[env][0]}, {args.seconds:g} s per system, seed {args.seed}; final: "
            f"{args.episodes} greedy episodes; threshold {THRESHOLDS[env]:g}"
        )
        print(f"{'system':<16} {'final return':>12} {'env steps':>10} {'to threshold':>13}")
        for name, r in rows.items():
            to = f"{r['to_threshold_s']:.0f} s" if r["to_threshold_s"] is not None else "-"
            print(f"{name:<16} {r['final_return']:>12.1f} {r['env_steps']:>10,} {to:>13}")
        zrl, sb3 = rows["zrl PPO"], rows["SB3 PPO (zoo)"]
        print(f"zrl / SB3 env steps in the same time: {zrl['env_steps'] / sb3['env_steps']:.2f}x")
        report[env] = rows
    print(json.dumps(report))


if __name__ == "__main__":
    main()
