"""MuJoCo HalfCheetah-v5 and Hopper-v5: zrl PPO or SAC against Stable-Baselines3's, in one run.

For each env, each system trains for the same wall-clock budget (``--seconds``, counted from
the launch: zrl's whole ``zrl run`` with its process start-up; SB3 from model construction,
its evaluation time excluded, in SB3's favour), one after the other on the same machine. Both
are then judged the same way: the mean return of ``--episodes`` greedy episodes of the final
policy (zrl: ``model_last.pt`` through ``zrl eval``; SB3: ``deterministic=True`` with its
observation normalization frozen), plus the env steps each made and, from the evaluations
along the way (zrl: eval.csv, every ``evaluator.interval`` s; SB3: every ``EVAL_EVERY`` env
steps, 5 episodes), the seconds to the first evaluation at ``THRESHOLDS``.

``--algo ppo`` (the default):

- zrl: ``configs/halfcheetah_ppo.yaml`` and ``configs/hopper_ppo.yaml`` (CleanRL's
  ppo_continuous_action.py hyperparameters).
- SB3 PPO: rl-baselines3-zoo's hyperparameters for these envs (hyperparams/ppo.yml,
  ``ZOO_PPO`` below: VecNormalize on observations and rewards, one env, a 256x256 ReLU MLP
  with ``log_std_init=-2``), torch on one thread as zrl's learner.

``--algo sac``:

- zrl: ``configs/halfcheetah_sac.yaml`` and ``configs/hopper_sac.yaml`` (the zoo's settings
  as far as zrl's config has them; one update per env step).
- SB3 SAC: rl-baselines3-zoo's hyperparameters (hyperparams/sac.yml, ``ZOO_SAC`` below:
  SB3's SAC defaults with 10k random steps first; no normalization), torch on one thread.

    pip install -e ".[mujoco,bench]"
    python benchmarks/mujoco_vs_sb3.py                          # both envs, 300 s each system
    python benchmarks/mujoco_vs_sb3.py --envs hopper --seconds 120
    python benchmarks/mujoco_vs_sb3.py --algo sac --envs hopper --seconds 300

Prints a table per env and a final JSON line. The CleanRL curves (1M steps) are the reference
for what returns at a given step count should be; 300 s on 2 cores is ~100-300k steps
with PPO and ~15-40k with SAC (one update per env step).
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
ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5"}
ALGOS = ("ppo", "sac")
THRESHOLDS = {"halfcheetah": 1000.0, "hopper": 1000.0}
# SB3's evaluations along the way, in env steps: SAC makes ~10x fewer steps in the same time.
EVAL_EVERY = {"ppo": 10_000, "sac": 5_000}
ZOO_PPO: dict[str, dict[str, Any]] = {
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
# rl-baselines3-zoo hyperparams/sac.yml (HalfCheetah-v3 / Hopper-v3, the "mujoco-defaults"
# anchor): SB3's SAC defaults with learning_starts 10000, written out here in full.
_ZOO_SAC_MUJOCO: dict[str, Any] = {
    "learning_rate": 3e-4,
    "buffer_size": 1_000_000,
    "learning_starts": 10_000,
    "batch_size": 256,
    "tau": 0.005,
    "gamma": 0.99,
    "train_freq": 1,
    "gradient_steps": 1,
    "ent_coef": "auto",
    "target_entropy": "auto",
}
ZOO_SAC: dict[str, dict[str, Any]] = {
    "halfcheetah": _ZOO_SAC_MUJOCO,
    "hopper": _ZOO_SAC_MUJOCO,
}


def config_for(algo: str, env: str) -> Path:
    """The zrl config the benchmark trains: ``configs/<env>_<algo>.yaml``."""
    return REPO / "configs" / f"{env}_{algo}.yaml"


def first_at(points: list[tuple[float, float]], threshold: float) -> float | None:
    """The time of the first (time, return) point at or above ``threshold``; None if none."""
    return next((t for t, r in points if r >= threshold), None)


def run_zrl(algo: str, env: str, seconds: float, episodes: int, seed: int) -> dict[str, Any]:
    env_id = ENVS[env]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.monotonic()
        subprocess.run(
            zrl_run_command(
                config_for(algo, env),
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


def sb3_model(algo: str, env: str, seed: int) -> tuple[Any, Any]:
    """The SB3 model with the zoo's settings for ``env``, and its VecNormalize (PPO) or None."""
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    vec = make_vec_env(ENVS[env], n_envs=1, seed=seed)
    if algo == "sac":
        return SAC("MlpPolicy", vec, seed=seed, verbose=0, **ZOO_SAC[env]), None
    norm = VecNormalize(vec)
    policy_kwargs = {
        "log_std_init": -2,
        "ortho_init": False,
        "activation_fn": torch.nn.ReLU,
        "net_arch": {"pi": [256, 256], "vf": [256, 256]},
    }
    model = PPO(
        "MlpPolicy", norm, seed=seed, verbose=0, policy_kwargs=policy_kwargs, **ZOO_PPO[env]
    )
    return model, norm


def run_sb3(algo: str, env: str, seconds: float, episodes: int, seed: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    env_id = ENVS[env]

    def greedy(model: Any, norm: Any, n: int, base: int) -> float:
        env1 = gym.make(env_id)
        total = []
        for ep in range(n):
            obs, _ = env1.reset(seed=base + ep)
            done, ret = False, 0.0
            while not done:
                seen = obs if norm is None else norm.normalize_obs(obs)
                action, _ = model.predict(seen, deterministic=True)
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
            if self.num_timesteps - self.last >= EVAL_EVERY[algo]:
                self.last = self.num_timesteps
                start = time.monotonic()
                ret = greedy(self.model, norm, 5, 1_000_000 + self.num_timesteps)
                self.excluded += time.monotonic() - start
                self.points.append((round(self.elapsed(), 1), ret))
            return self.elapsed() < seconds

    budget = Budget()  # the clock starts before the env and the model are built
    model, norm = sb3_model(algo, env, seed)
    model.learn(total_timesteps=100_000_000, callback=budget)
    if norm is not None:
        norm.training = False
    return {
        "final_return": greedy(model, norm, episodes, 2_000_000),
        "env_steps": int(model.num_timesteps),
        "seconds": round(budget.elapsed(), 1),
        "to_threshold_s": first_at(budget.points, THRESHOLDS[env]),
        "evaluations": budget.points,
        "env": env_id,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``envs`` comes back as a checked list of ``ENVS`` keys."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="ppo or sac on both sides")
    parser.add_argument("--envs", default="halfcheetah,hopper")
    parser.add_argument("--seconds", type=float, default=300.0, help="wall clock per system")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    for e in args.envs:
        if e not in ENVS:
            parser.error(f"unknown env {e!r}; choose from {','.join(ENVS)}")
    return args


def main() -> None:
    args = parse_args()
    name = args.algo.upper()
    sb3_name, zrl_name = f"SB3 {name} (zoo)", f"zrl {name}"
    report: dict[str, Any] = {}
    for env in args.envs:
        rows = {
            sb3_name: run_sb3(args.algo, env, args.seconds, args.episodes, args.seed),
            zrl_name: run_zrl(args.algo, env, args.seconds, args.episodes, args.seed),
        }
        print(
            f"\n{ENVS[env]}, {args.seconds:g} s per system, seed {args.seed}; final: "
            f"{args.episodes} greedy episodes; threshold {THRESHOLDS[env]:g}"
        )
        print(f"{'system':<16} {'final return':>12} {'env steps':>10} {'to threshold':>13}")
        for system, r in rows.items():
            to = f"{r['to_threshold_s']:.0f} s" if r["to_threshold_s"] is not None else "-"
            print(f"{system:<16} {r['final_return']:>12.1f} {r['env_steps']:>10,} {to:>13}")
        zrl, sb3 = rows[zrl_name], rows[sb3_name]
        print(f"zrl / SB3 env steps in the same time: {zrl['env_steps'] / sb3['env_steps']:.2f}x")
        report[env] = rows
    print(json.dumps(report))


if __name__ == "__main__":
    main()
