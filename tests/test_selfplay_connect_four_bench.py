"""``benchmarks/selfplay_connect_four.py``: the learning curve it reads from a run's eval.csv
(losses per seat against alpha-beta at depth 4, greedy and search) and its speed figure."""

from __future__ import annotations

import csv
from pathlib import Path

from tests.helpers.benchmarks import load_benchmark


def test_the_curve_holds_each_evaluations_losses_per_seat_and_player(tmp_path: Path) -> None:
    bench = load_benchmark("selfplay_connect_four")
    path = tmp_path / "eval.csv"
    fields = ["time", "env_steps", "weights_version", "episodes"]
    fields += [f"alphabeta4_{s}_loss_rate" for s in ("first", "second")]
    fields += [f"search_alphabeta4_{s}_loss_rate" for s in ("first", "second")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerow(dict(zip(fields, [30, 1000, 1, 20, 1.0, 0.9, 0.5, 0.4], strict=True)))
        writer.writerow(dict(zip(fields, [150, 9000, 12, 200, 0.8, 1.0, 0.0, 0.1], strict=True)))
    rows = bench.curve(path)
    assert rows[0] == {
        "minutes": 0.5,
        "env_steps": 1000,
        "weights_version": 1,
        "episodes": 20,
        "loss_first": 1.0,
        "loss_second": 0.9,
        "search_loss_first": 0.5,
        "search_loss_second": 0.4,
    }
    assert rows[1]["minutes"] == 2.5 and rows[1]["search_loss_second"] == 0.1
    fast = bench.speed(100.0, 20_000, 2)
    assert fast["moves_per_s_per_actor"] == 100.0
