"""MAPPO on MPE simple_spread: greedy per-agent return over wall time, against a random policy.

Runs ``configs/simple_spread_mappo.yaml`` (PPO, 3 agents sharing one policy, a centralised
critic: ``env.multiagent.central_value``) with ``python -m zrl run ... --set
stop.wall_time=SECONDS`` in a subprocess, then reads the run's ``eval.csv``: every
evaluation's time (seconds since the run started, start-up included), env steps (agent
steps: each game step is 3) and mean greedy per-agent return over ``evaluator.episodes``
games. In this process it measures the uniformly random policy on the same envs
(``zrl.envs.multiagent.envs.make_multiagent_vector_env``, the config's ``env.kwargs``).

Prints the evaluations, the last one at or before 30/60/120/180 s (and ``--seconds``), and the
final return (mean of the last ``--final-evals`` evaluations) against the random baseline:
the difference (> 0: better than random) and the ratio final / random (returns are negative
costs: < 1 is better than random).

    python benchmarks/mappo.py                        # 180 s
    python benchmarks/mappo.py --seconds 120 --set env.multiagent.central_value=false
    python benchmarks/mappo.py --write-curve          # docs/simple_spread_curve.csv and .png

``--write-curve`` writes the evaluations to ``docs/simple_spread_curve.csv`` (seconds,
env_steps, eval_return) and, if matplotlib is installed, ``docs/simple_spread_curve.png``.
The run happens in a temporary directory unless ``--run-dir`` is given.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zrl.config.experiment import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "simple_spread_mappo.yaml"
CURVE_OUT = REPO / "docs" / "simple_spread_curve"  # .csv and .png
CHECKPOINTS = (30.0, 60.0, 120.0, 180.0)

Evaluation = tuple[float, int, float]  # seconds since the run started, env steps, mean return


def random_baseline(cfg: ExperimentConfig, games: int, seed: int) -> tuple[float, float]:
    """Mean per-agent return of uniformly random actions over ``games`` episodes of the
    config's env, and its standard error over the games (each game's agents share most of
    their reward, so the game is the independent unit)."""
    import numpy as np

    from zrl.envs.multiagent.envs import make_multiagent_vector_env

    envs = make_multiagent_vector_env(cfg.env.id, dict(cfg.env.kwargs), cfg.env.multiagent, games)
    try:
        rng = np.random.default_rng(seed)
        envs.reset(seed=seed)
        returns = np.zeros(envs.num_envs)
        finished = np.zeros(envs.num_envs, dtype=bool)
        while not finished.all():
            _, r, term, trunc, _ = envs.step(rng.integers(0, envs.num_actions, envs.num_envs))
            returns += np.where(finished, 0.0, r)
            finished |= np.asarray(term) | np.asarray(trunc)
    finally:
        envs.close()
    per_game = returns.reshape(games, -1).mean(axis=1)
    return float(returns.mean()), float(per_game.std(ddof=1) / np.sqrt(games))


def run_zrl(config: Path, seconds: float, seed: int, overrides: list[str], run_dir: Path) -> None:
    cmd = [
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
        f"stop.wall_time={seconds:g}",
    ]
    for item in overrides:
        cmd += ["--set", item]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO)
    if proc.returncode != 0 or not (run_dir / "eval.csv").is_file():
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"zrl run failed (exit {proc.returncode}); see {run_dir}/logs")


def read_evals(run_dir: Path) -> list[Evaluation]:
    with open(run_dir / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        (float(r["time"]), int(float(r["env_steps"])), float(r["mean"])) for r in rows if r["mean"]
    ]


def at(evals: list[Evaluation], t: float) -> Evaluation | None:
    """The last evaluation at or before ``t`` seconds."""
    before = [e for e in evals if e[0] <= t]
    return before[-1] if before else None


def write_curve(
    evals: list[Evaluation], random_return: float, out: Path, title: str, algo: str
) -> list[Path]:
    csv_path, png = out.with_suffix(".csv"), out.with_suffix(".png")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "env_steps", "eval_return"])
        for t, steps, ret in evals:
            w.writerow([round(t, 2), steps, round(ret, 3)])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG", file=sys.stderr)
        return [csv_path]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, x, label in (
        (axes[0], [e[0] for e in evals], "seconds since launch"),
        (axes[1], [e[1] for e in evals], "env steps (agent steps)"),
    ):
        ax.plot(x, [e[2] for e in evals], marker="o", ms=3, label=f"{algo}, greedy")
        ax.axhline(random_return, color="grey", ls="--", label="random policy")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean per-agent episode return")
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return [csv_path, png]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=180.0,
        help="wall time of the zrl run (stop.wall_time), default 180",
    )
    parser.add_argument("--config", type=Path, default=CONFIG, help="default %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed, default 0")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override passed to zrl run (and to the random baseline's envs); repeatable",
    )
    parser.add_argument(
        "--random-games",
        type=int,
        default=500,
        help="games of the random-policy baseline, default 500",
    )
    parser.add_argument(
        "--final-evals",
        type=int,
        default=3,
        help="the final return is the mean of this many last evaluations, default 3",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="keep the run here (default: a temporary directory)",
    )
    parser.add_argument(
        "--write-curve",
        action="store_true",
        help="write CURVE_OUT.csv (seconds, env_steps, eval_return) and .png",
    )
    parser.add_argument(
        "--curve-out",
        type=Path,
        default=CURVE_OUT,
        help="path of the curve files without suffix, default %(default)s",
    )
    args = parser.parse_args()

    cfg = load_config(args.config, args.overrides)
    t0 = time.perf_counter()
    random_mean, random_se = random_baseline(cfg, args.random_games, seed=12345)
    print(
        f"random policy: {random_mean:.2f} +- {random_se:.2f} per agent over "
        f"{args.random_games} games ({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        launched = time.time()
        run_zrl(args.config, args.seconds, args.seed, args.overrides, run_dir)
        took = time.time() - launched
        evals = read_evals(run_dir)
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if not evals:
        raise SystemExit("the run recorded no evaluation")

    print(
        f"\nzrl run: {took:.0f} s in all, {summary.get('env_steps', '?')} env steps, "
        f"{summary.get('evals_dropped', 0)} evaluations dropped, load {os.getloadavg()[0]:.2f}"
    )
    print(f"\n{'seconds':>8} {'env steps':>10} {'greedy return':>14}")
    for t, steps, ret in evals:
        print(f"{t:8.1f} {steps:10d} {ret:14.2f}")

    print(f"\nlast evaluation at or before (random {random_mean:.2f}):")
    for mark in sorted({*CHECKPOINTS, args.seconds}):
        if mark > args.seconds:
            continue
        e = at(evals, mark)
        shown = "   n/a" if e is None else f"{e[2]:6.2f}  ({e[0]:.0f} s, {e[1]} env steps)"
        print(f"  {mark:5.0f} s: {shown}")

    last = evals[-args.final_evals :]
    final = statistics.fmean(e[2] for e in last)
    print(
        f"\nfinal (mean of the last {len(last)} evaluations, "
        f"{last[0][0]:.0f}-{last[-1][0]:.0f} s): {final:.2f} per agent"
    )
    print(
        f"vs random {random_mean:.2f}: difference {final - random_mean:+.2f}, "
        f"ratio final/random {final / random_mean:.2f} (< 1: better than random)"
    )

    if args.write_curve:
        critic = "central critic" if cfg.env.multiagent.central_value else "no central critic"
        title = f"PPO on {cfg.env.id} ({critic}), {args.seconds:g} s on {os.cpu_count()} CPU cores"
        algo = "MAPPO" if cfg.env.multiagent.central_value else "PPO"
        written = write_curve(evals, random_mean, args.curve_out, title, algo)
        print("written:", ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
