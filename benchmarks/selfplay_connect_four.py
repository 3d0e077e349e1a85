"""Connect four on the same machine and time: AlphaZero (self-play with search) against the
PPO league (self-play without), each trained for ``--minutes`` by `zrl run`, one after the
other, and evaluated alike: against random and alpha-beta at depths 2 and 4 (random
tie-breaking), 10 games from each seat, every 2 minutes.

    python benchmarks/selfplay_connect_four.py --minutes 30
    python benchmarks/selfplay_connect_four.py --alphazero-run runs/c4   # a run already made

Prints, per config, the learning curve against alpha-beta at depth 4: each evaluation's
losses per seat (the greedy policy's; AlphaZero's search player's too, 200 simulations a
move), then the self-play speed (moves and games per second, per actor). ``--keep DIR``
keeps each run's directory (logs, eval.csv), ``--out FILE`` the rows as JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OPPONENT = "alphabeta4"
"""The issue's reference opponent."""
SAME_EVALUATION = [
    "--set",
    "env.multiagent.eval_opponents=[random,alphabeta2,alphabeta4]",
    "--set",
    "evaluator.interval=120",
    "--set",
    "evaluator.episodes=20",
]
"""The PPO league's evaluation made AlphaZero's (its config evaluates every 10 s against random
and scripted)."""


def curve(eval_csv: Path) -> list[dict[str, Any]]:
    """Each evaluation of ``eval_csv``: minutes, env steps, weights version, games, and the
    losses per seat against ``OPPONENT`` of the greedy policy and, where the run has one, of
    the search player."""
    rows = []
    with open(eval_csv, newline="") as f:
        for row in csv.DictReader(f):
            out: dict[str, Any] = {
                "minutes": round(float(row["time"]) / 60, 1),
                "env_steps": int(float(row["env_steps"])),
                "weights_version": int(float(row["weights_version"])),
                "episodes": int(float(row["episodes"])),
            }
            for player in ("", "search_"):
                for seat in ("first", "second"):
                    value = row.get(f"{player}{OPPONENT}_{seat}_loss_rate")
                    if value not in (None, ""):
                        out[f"{player}loss_{seat}"] = float(value)
            rows.append(out)
    return rows


def progress(run_dir: Path) -> tuple[float, float]:
    """(seconds, env steps) of a run: summary.json's, or progress.csv's last row while it
    runs."""
    summary = run_dir / "summary.json"
    if summary.is_file():
        done = json.loads(summary.read_text())
        return float(done.get("wall_time") or 0.0), float(done.get("env_steps") or 0)
    with open(run_dir / "progress.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    return float(last["time"]), float(last["env_steps"])


def speed(seconds: float, moves: float, actors: int) -> dict[str, float]:
    """Self-play moves per second per actor over the run's wall time."""
    per_actor = moves / max(seconds, 1e-9) / max(actors, 1)
    return {"seconds": seconds, "moves": moves, "moves_per_s_per_actor": per_actor}


def run(config: str, minutes: float, keep: Path | None, extra: list[str]) -> Path:
    """`zrl run config` for ``minutes`` (no stop rule but the clock); its run directory."""
    tmp = Path(tempfile.mkdtemp(prefix="c4-"))
    run_dir = (keep or tmp) / Path(config).stem
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / config)]
    cmd += ["--run-dir", str(run_dir), "--set", f"stop.wall_time={minutes * 60:g}"]
    cmd += ["--set", "stop.eval_return=null", *extra]
    subprocess.run(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=False)
    return run_dir


def report(name: str, run_dir: Path) -> dict[str, Any]:
    seconds, moves = progress(run_dir)
    config = (run_dir / "config.yaml").read_text()
    actors = next(
        (
            int(line.split(":")[1])
            for line in config.splitlines()
            if line.strip().startswith("actors:")
        ),
        1,
    )
    rows = curve(run_dir / "eval.csv")
    print(f"\n{name} ({run_dir}): {moves:,.0f} moves in {seconds:,.0f} s")
    searched = any("search_loss_first" in r for r in rows)
    head = "| min | env steps | weights | games | greedy: losses first / second |"
    print(head + (" search: losses first / second |" if searched else ""))
    print("|" + " --- |" * (5 + searched))
    for r in rows:
        line = (
            f"| {r['minutes']} | {r['env_steps']:,} | v{r['weights_version']} | {r['episodes']} | "
            f"{r.get('loss_first', '-')} / {r.get('loss_second', '-')} |"
        )
        if searched:
            line += f" {r.get('search_loss_first', '-')} / {r.get('search_loss_second', '-')} |"
        print(line)
    fast = speed(seconds, moves, actors)
    print(f"self-play: {fast['moves_per_s_per_actor']:,.0f} moves/s per actor ({actors} actors)")
    return {"name": name, "run_dir": str(run_dir), "curve": rows, **fast}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--alphazero-run", type=Path, help="read this run instead of training")
    parser.add_argument("--ppo-run", type=Path, help="read this run instead of training")
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    for name, config, given, extra in (
        ("AlphaZero", "connect_four_alphazero.yaml", args.alphazero_run, []),
        ("PPO league", "connect_four_ppo.yaml", args.ppo_run, SAME_EVALUATION),
    ):
        run_dir = given or run(config, args.minutes, args.keep, extra)
        results.append(report(name, run_dir))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
