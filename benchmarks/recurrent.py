"""Time to solve CartPole without velocities: zrl R2D2 and PPO-LSTM, sb3-contrib RecurrentPPO.

A feed-forward zrl PPO runs on the same env to show that the task needs memory.

The env is ``zrl/CartPoleNoVel-v1`` (zrl/envs/pomdp.py): CartPole-v1 observing only the cart
position and the pole angle. For each seed: wall-clock seconds and env steps until the mean
greedy return over 20 episodes reaches 475, measured from the moment the command is launched:

- zrl R2D2 (configs/cartpole_novel_r2d2.yaml) and zrl recurrent PPO
  (configs/cartpole_novel_ppo_lstm.yaml): the whole ``zrl run``, process start-up included;
- zrl feed-forward PPO: configs/cartpole_ppo.yaml with ``env.id=zrl/CartPoleNoVel-v1``. It is
  not expected to reach 475; its best evaluation (summary.json ``best_eval_return``) is shown;
- sb3-contrib RecurrentPPO in a fresh Python process too (so both pay for importing torch),
  timed from its launch, with its blocking evaluations' time excluded (in its favour; zrl's
  evaluator runs alongside training and is not excluded). It evaluates every 2048 env steps:
  20 deterministic episodes, the LSTM state carried through each episode (``predict`` with
  ``state`` and ``episode_start``), observations normalized with the training VecNormalize
  statistics (not updated by the evaluation; rewards unnormalized).

RecurrentPPO uses rl-baselines3-zoo's tuned hyperparameters for CartPoleNoVel-v1
(https://github.com/DLR-RM/rl-baselines3-zoo, hyperparams/ppo_lstm.yml)::

    normalize: True              # VecNormalize(norm_obs, norm_reward, gamma=0.98), as the
    n_envs: 8                    # zoo's ExperimentManager builds it
    n_timesteps: !!float 1e5     # the budget the linear schedules decay over
    policy: 'MlpLstmPolicy'
    n_steps: 32
    batch_size: 256
    gae_lambda: 0.8
    gamma: 0.98
    n_epochs: 20
    ent_coef: 0.0
    learning_rate: lin_0.001
    clip_range: lin_0.2
    policy_kwargs: "dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64,
                         enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64]))"

The zoo's CartPoleNoVel-v1 (rl_zoo3.wrappers.MaskVelocityWrapper) multiplies the velocities by
zero and keeps a 4-vector; both sides here use zrl's env, which drops them (a 2-vector): the
same information (VecNormalize maps the zoo's constant zeros to zeros). Runs are interleaved
per seed (sb3, r2d2, ppo_lstm, ff) so load drifts hit every system alike. Prints each run as
it ends, then the medians over the seeds and the ratios sb3 seconds / zrl seconds (> 1: zrl
is faster).

    python benchmarks/recurrent.py                       # 5 seeds, 600 s per run
    python benchmarks/recurrent.py --seeds 1 --systems sb3 --limit 300

sb3-contrib is an optional dependency: pip install -e ".[bench]".
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "zrl/CartPoleNoVel-v1"
TARGET = 475.0
EVAL_EPISODES = 20
EVAL_EVERY = 2048
SB3_BUDGET = 100_000  # the zoo's n_timesteps

# key: (name, config, extra --set overrides)
ZRL_SYSTEMS: dict[str, tuple[str, str, list[str]]] = {
    "r2d2": ("zrl R2D2", "cartpole_novel_r2d2.yaml", []),
    "ppo_lstm": ("zrl PPO-LSTM", "cartpole_novel_ppo_lstm.yaml", []),
    "ff": ("zrl PPO (no memory)", "cartpole_ppo.yaml", ["--set", f"env.id={ENV_ID}"]),
}
SB3 = "SB3 RecurrentPPO"
SYSTEMS = {"sb3": SB3, **{k: v[0] for k, v in ZRL_SYSTEMS.items()}}


@dataclass
class Result:
    seconds: float | None  # to the target, from launch; None if not reached
    steps: int | None  # env steps to the target, or in all if not reached
    best: float | None  # best evaluation's mean return

    def describe(self) -> str:
        best = "n/a" if self.best is None else f"{self.best:.1f}"
        if self.seconds is None:
            return f"not reached ({self.steps} steps, best eval {best})"
        return f"{self.seconds:.1f} s, {self.steps} steps (best eval {best})"


def run_zrl(seed: int, limit: float, config: Path, extra: list[str]) -> Result:
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
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=limit + 120,
            cwd=REPO,
        )
        summary_path = run_dir / "summary.json"
        if not summary_path.is_file():
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return Result(None, None, None)
        summary = json.loads(summary_path.read_text())
        best = summary.get("best_eval_return")
        if not summary["reached_target"]:
            return Result(None, summary.get("env_steps"), best)
        return Result(summary["target_reached_at"] - t0, summary["env_steps_to_target"], best)


def run_sb3(seed: int, limit: float) -> tuple[Result, float | None]:
    """RecurrentPPO in a fresh process, like `zrl run`: the result timed from launch, and the
    seconds from model construction."""
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
        return Result(None, None, None), None
    return Result(out["from_launch"], out["steps"], out["best"]), out["from_model"]


def sb3_worker(seed: int, limit: float, launched: float) -> None:
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    sys.path.insert(0, str(REPO))  # this checkout's zrl/envs/pomdp.py (gymnasium and numpy only)
    from zrl.envs.pomdp import cartpole_no_velocity

    torch.set_num_threads(1)

    class EvalUntilSolved(BaseCallback):
        """Greedy 20-episode evaluation every 2048 env steps; its time is not counted."""

        def __init__(self, vec_normalize: VecNormalize) -> None:
            super().__init__()
            self.eval_env = cartpole_no_velocity()
            self.vec_normalize = vec_normalize
            self.excluded = 0.0
            self.last_eval = 0
            self.best: float | None = None
            self.solved_at: tuple[float, float, int] | None = None
            self.t0 = time.time()

        def episode(self, reset_seed: int) -> float:
            obs, _ = self.eval_env.reset(seed=reset_seed)
            state, start = None, np.ones((1,), dtype=bool)
            done, total = False, 0.0
            while not done:
                # The training statistics, read only (normalize_obs does not update them).
                norm = self.vec_normalize.normalize_obs(obs[None])
                action, state = self.model.predict(
                    norm, state=state, episode_start=start, deterministic=True
                )
                start = np.zeros((1,), dtype=bool)
                obs, r, term, trunc, _ = self.eval_env.step(int(action[0]))
                total += float(r)
                done = term or trunc
            return total

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last_eval < EVAL_EVERY:
                return time.time() - self.t0 - self.excluded < limit
            self.last_eval = self.num_timesteps
            start = time.perf_counter()
            mean = float(np.mean([self.episode(10_000 * seed + ep) for ep in range(EVAL_EPISODES)]))
            self.best = mean if self.best is None else max(self.best, mean)
            self.excluded += time.perf_counter() - start
            if mean >= TARGET:
                now = time.time() - self.excluded
                self.solved_at = (now - launched, now - self.t0, self.num_timesteps)
                return False
            return time.time() - self.t0 - self.excluded < limit

    def linear(v: float):
        return lambda progress_remaining: progress_remaining * v

    # rl-baselines3-zoo hyperparameters for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml).
    env = VecNormalize(make_vec_env(cartpole_no_velocity, n_envs=8, seed=seed), gamma=0.98)
    callback = EvalUntilSolved(env)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=seed,
        verbose=0,
    )
    model.learn(total_timesteps=SB3_BUDGET, callback=callback)
    solved = callback.solved_at or (None, None, None)
    steps = solved[2] if solved[2] is not None else model.num_timesteps
    print(
        json.dumps(
            {
                "from_launch": solved[0],
                "from_model": solved[1],
                "steps": steps,
                "best": callback.best,
            }
        )
    )


def median(values: list[float | None]) -> float:
    return statistics.median([v if v is not None else math.inf for v in values])


def finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def fmt(values: list[float | None]) -> str:
    """The median (unreached counted as infinite), or 'not reached' if the median is."""
    m = median(values)
    return f"{m:.1f}" if math.isfinite(m) else "not reached"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--sb3-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_worker is not None:
        sb3_worker(args.sb3_worker, args.limit, args.launched or time.time())
        return
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"unknown system {s!r}; choose from {','.join(SYSTEMS)}")
        if s in ZRL_SYSTEMS and not (REPO / "configs" / ZRL_SYSTEMS[s][1]).is_file():
            parser.error(f"{s}: configs/{ZRL_SYSTEMS[s][1]} does not exist")
    if args.skip_sb3:
        systems = [s for s in systems if s != "sb3"]
    if "sb3" in systems:
        try:
            import sb3_contrib  # noqa: F401
        except ImportError:
            parser.error('sb3-contrib is not installed: pip install -e ".[bench]" (or --skip-sb3)')

    results: dict[str, list[Result]] = {s: [] for s in systems}
    sb3_from_model: list[float | None] = []
    for seed in range(args.seeds):
        for s in systems:
            if s == "sb3":
                r, from_model = run_sb3(seed, args.limit)
                sb3_from_model.append(from_model)
                note = f" ({from_model:.1f} s from model construction)" if from_model else ""
            else:
                _, config, extra = ZRL_SYSTEMS[s]
                r = run_zrl(seed, args.limit, REPO / "configs" / config, extra)
                note = ""
            results[s].append(r)
            print(f"seed {seed}: {s:<8} {r.describe()}{note}", flush=True)

    print(
        f"\n{ENV_ID}, mean greedy return over {EVAL_EPISODES} episodes >= {TARGET:.0f}, "
        f"median of {args.seeds} seeds, {args.limit:.0f} s per run"
    )
    print(f"{'system':<20} {'seconds':>12} {'env steps':>12} {'reached':>8} {'best eval':>10}")
    report: dict[str, object] = {}
    for s, rs in results.items():
        secs = [r.seconds for r in rs]
        steps = [
            float(r.steps) if r.seconds is not None and r.steps is not None else None for r in rs
        ]
        bests = [r.best for r in rs if r.best is not None]
        best = statistics.median(bests) if bests else None
        reached = sum(r.seconds is not None for r in rs)
        shown_best = "n/a" if best is None else f"{best:.1f}"
        print(
            f"{SYSTEMS[s]:<20} {fmt(secs):>12} {fmt(steps):>12} "
            f"{f'{reached}/{len(rs)}':>8} {shown_best:>10}"
        )
        report[s] = {
            "seconds": secs,
            "env_steps": [r.steps for r in rs],
            "best_eval_return": [r.best for r in rs],
            "median_seconds": finite(median(secs)),
            "median_env_steps": finite(median(steps)),
            "median_best_eval_return": best,
            "reached": reached,
        }
    if sb3_from_model:
        print(f"{'(SB3 from model)':<20} {fmt(sb3_from_model):>12}")
        report["sb3_seconds_from_model_construction"] = sb3_from_model
    if "sb3" in results:
        print()
        sm = median([r.seconds for r in results["sb3"]])
        for s in ("r2d2", "ppo_lstm"):
            if s not in results:
                continue
            zm = median([r.seconds for r in results[s]])
            ratio = sm / zm if math.isfinite(zm) and math.isfinite(sm) else None
            shown = f"{ratio:.2f}" if ratio is not None else "n/a"
            print(f"{SB3} / {SYSTEMS[s]} (median seconds): {shown}")
            report[f"sb3_over_{s}"] = ratio
    print(json.dumps(report))


if __name__ == "__main__":
    main()
