"""Self-play league throughput and win rates: tic-tac-toe or connect four through real processes.

Runs ``zrl run configs/<game>_ppo.yaml`` (PPO, a league role, two actors, the evaluator playing
the random and scripted players) for ``--seconds`` and prints, from the run directory:

- games/s through the actors and the league: the league's finished-game count
  (``train_metrics.csv``, tag ``league/games``: every result the actors reported) over time,
  against a bare baseline measured first in this process: one core playing the same
  PettingZoo game with uniformly random legal moves and no learning, no messaging;
- env steps/s (the learning policy's moves) from ``progress.csv``;
- the win/draw/loss rates of the greedy learning policy against random and scripted over time
  (``eval.csv``), the league's snapshots and main's Elo at the end (``train_metrics.csv``);
- the wall time until the policy first met the issue's bar: tic-tac-toe wins >= 95% against
  random and loses <= 5% against scripted; connect four wins >= 90% against random.

    python benchmarks/league.py                          # tic-tac-toe, 300 s
    python benchmarks/league.py --game connect_four --seconds 300
    python benchmarks/league.py --game tictactoe --seconds 600 --set league.fixed_share=0.5
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {"tictactoe": "tictactoe_ppo.yaml", "connect_four": "connect_four_ppo.yaml"}
ENV_IDS = {"tictactoe": "pettingzoo/tictactoe_v3", "connect_four": "pettingzoo/connect_four_v3"}


def bare_games_per_s(game: str, seconds: float = 5.0) -> float:
    """Games/s of the raw PettingZoo env on one core, random legal moves, nothing else."""
    from zrl.envs.multiagent.pettingzoo import env_module

    env = env_module(ENV_IDS[game]).raw_env()
    rng = np.random.default_rng(0)
    games, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        env.reset(seed=games)
        while True:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                break
            mask = env.observe(agent)["action_mask"]
            env.step(int(rng.choice(np.flatnonzero(mask))))
        games += 1
    return games / (time.perf_counter() - started)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def meets_bar(game: str, row: dict[str, str]) -> bool:
    win = number(row.get("random_win_rate"))
    if game == "connect_four":
        return win is not None and win >= 0.90
    loss = number(row.get("scripted_loss_rate"))
    return win is not None and loss is not None and win >= 0.95 and loss <= 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", choices=sorted(CONFIGS), default="tictactoe")
    parser.add_argument("--seconds", type=float, default=300.0, help="wall time of the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for the run",
    )
    args = parser.parse_args()

    bare = bare_games_per_s(args.game)
    print(f"bare {args.game}: {bare:,.0f} games/s on one core (random legal moves, no learning)")
    with tempfile.TemporaryDirectory(prefix="zrl-league-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "zrl",
            "run",
            str(REPO / "configs" / CONFIGS[args.game]),
            "--run-dir",
            str(run_dir),
            "--set",
            f"seed={args.seed}",
            "--set",
            f"stop.wall_time={args.seconds}",
        ]
        for item in args.set:
            cmd += ["--set", item]
        print("$ " + " ".join(cmd[2:]), flush=True)
        launched = time.monotonic()
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.monotonic() - launched
        if done.returncode != 0:
            sys.exit(
                f"zrl run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        report(args.game, run_dir, bare, wall)


def report(game: str, run_dir: Path, bare: float, wall: float) -> None:
    train = read_csv(run_dir / "train_metrics.csv")
    games = [(float(r["time"]), float(r["value"])) for r in train if r["tag"] == "league/games"]
    progress = read_csv(run_dir / "progress.csv")
    evals = read_csv(run_dir / "eval.csv")
    print(f"\nrun: {wall:.0f} s wall from launch, {run_dir.name}")
    if len(games) >= 2:
        (t0, g0), (t1, g1) = games[0], games[-1]
        rate = (g1 - g0) / max(t1 - t0, 1e-9)
        print(
            f"games through the actors and the league: {g1:,.0f} in all, {rate:,.0f} games/s "
            f"from {t0:.0f} s to {t1:.0f} s ({rate / bare:.2f}x one bare core of random play)"
        )
    if progress:
        last = progress[-1]
        steps, seconds = number(last.get("env_steps")) or 0, number(last.get("time")) or 1
        print(f"learning policy's moves: {steps:,.0f} env steps, {steps / seconds:,.0f}/s")
    print("\n  time   env steps  random win/draw/loss   scripted win/draw/loss")
    first_bar = None
    for row in evals:
        cells = []
        for opponent in ("random", "scripted"):
            rates = [number(row.get(f"{opponent}_{o}_rate")) for o in ("win", "draw", "loss")]
            cells.append("  ".join("  -  " if r is None else f"{r:.2f}" for r in rates))
        print(
            f"{float(row['time']):6.0f} {float(row['env_steps']):11,.0f}   "
            f"{cells[0]:20}   {cells[1]}"
        )
        if first_bar is None and meets_bar(game, row):
            first_bar = float(row["time"])
    bar = (
        "wins >= 0.90 vs random"
        if game == "connect_four"
        else "wins >= 0.95 vs random and loses <= 0.05 vs scripted"
    )
    print(f"\nbar ({bar}): " + (f"first met at {first_bar:.0f} s" if first_bar else "not met"))
    final = {r["tag"]: number(r["value"]) for r in train if r["tag"].startswith("league/")}
    elo = {k.removeprefix("league/elo_"): v for k, v in final.items() if "/elo_" in k}
    if final:
        print(
            f"league at the end: {final.get('league/snapshots', 0):.0f} snapshots, main's win "
            f"rate over them {final.get('league/main_win_rate', 0):.2f}; Elo: "
            + ", ".join(
                f"{k} {v:.0f}" for k, v in sorted(elo.items(), key=lambda kv: -(kv[1] or 0))
            )
        )


if __name__ == "__main__":
    main()
