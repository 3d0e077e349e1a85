"""The run directory's CSV files and TensorBoard scalars (written without importing torch)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.config.experiment import load_config
from zrl.run.aggregator import Aggregator
from zrl.run.metrics import (
    BASE_EVAL_FIELDS,
    EVAL_FIELDS,
    EXPLOITABILITY_FIELDS,
    LEAGUE_COUNTS,
    MAX_LEAGUE_MEMBERS,
    MetricsWriter,
    eval_fields,
    exploitability_summary,
    league_figures,
    league_record,
    read_csv,
    reference_rates,
)
from zrl.testing.processes import REPO


def test_metrics_writer_csv_and_tensorboard_scalars(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.write_progress({"time": 1.0, "env_steps": 100, "env_steps_per_s": 50.0, "updates": 3})
    writer.write_eval({"time": 1.5, "env_steps": 100, "mean": 21.5, "std": 2.0})
    writer.close()
    assert read_csv(tmp_path / "progress.csv")[0]["env_steps"] == 100
    assert read_csv(tmp_path / "eval.csv")[0]["mean"] == 21.5
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "eval/return_mean" in events.Tags()["scalars"]
    (point,) = events.Scalars("eval/return_mean")
    assert (point.step, point.value) == (100, 21.5)
    assert [p.value for p in events.Scalars("progress/env_steps_per_s")] == [50.0]


def test_the_supervisor_does_not_import_torch() -> None:
    # zrl run starts its roles from a zygote that imports torch; the supervisor importing it
    # too would take about 2 s of CPU from them at start-up.
    code = (
        "import sys, tempfile, pathlib; import zrl.run; from zrl.run.metrics import "
        "MetricsWriter; MetricsWriter(pathlib.Path(tempfile.mkdtemp())).close(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_evaluations_exploitability_goes_to_eval_csv_and_tensorboard(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.write_eval(
        {
            "time": 2.0,
            "env_steps": 300,
            "mean": 0.9,
            "std": 0.1,
            "exploitability": 0.5,
            "exploitability_first": 0,
            "exploitability_second": -1,
            "losing_lines": 66,
        }
    )
    writer.close()
    (row,) = read_csv(tmp_path / "eval.csv")
    assert row["exploitability"] == 0.5 and row["losing_lines"] == 66
    assert (row["exploitability_first"], row["exploitability_second"]) == (0, -1)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    (point,) = events.Scalars("eval/exploitability")
    assert (point.step, point.value) == (300, 0.5)


def eval_header(run_dir: Path) -> list[str]:
    with open(run_dir / "eval.csv", newline="") as f:
        return next(csv.reader(f))


def test_a_cartpole_eval_csv_has_only_the_columns_its_evaluations_fill(tmp_path: Path) -> None:
    config = load_config(REPO / "configs" / "cartpole_ppo.yaml").model_dump(mode="json")
    writer = MetricsWriter(tmp_path, tensorboard=False, config=config)
    writer.write_eval({"time": 1.5, "env_steps": 100, "mean": 21.5, "std": 2.0, "episodes": 5})
    writer.close()
    assert eval_header(tmp_path) == BASE_EVAL_FIELDS
    (row,) = read_csv(tmp_path / "eval.csv")
    assert (row["mean"], row["episodes"]) == (21.5, 5)


def test_a_league_eval_csv_has_the_rates_and_the_exploitability(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs" / "tictactoe_league.yaml")
    rates = [
        f"{opponent}_{outcome}_rate"
        for opponent in cfg.env.multiagent.eval_opponents
        for outcome in ("win", "draw", "loss")
    ]
    seats = [
        f"{opponent}_{seat}_{outcome}_rate"
        for opponent in cfg.env.multiagent.eval_opponents
        for seat in ("first", "second")
        for outcome in ("win", "draw", "loss")
    ]
    writer = MetricsWriter(tmp_path, tensorboard=False, config=cfg.model_dump(mode="json"))
    writer.write_eval(
        {"time": 2.0, "env_steps": 300, "mean": 0.9, **dict.fromkeys(rates, 0.5)}
        | {"exploitability": 0.5, "exploitability_first": 0, "losing_lines": 66}
    )
    writer.close()
    assert eval_header(tmp_path) == [*BASE_EVAL_FIELDS, *rates, *seats, *EXPLOITABILITY_FIELDS]
    (row,) = read_csv(tmp_path / "eval.csv")
    assert all(row[k] == 0.5 for k in rates) and row["losing_lines"] == 66
    assert "exploitability_second" not in row  # a column, empty in this row


def test_an_alphazero_eval_csv_has_the_search_players_figures_too(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs" / "tictactoe_alphazero.yaml")
    header = eval_fields(cfg.model_dump(mode="json"))
    for opponent in cfg.env.multiagent.eval_opponents:
        for prefix in ("", "search_"):
            assert f"{prefix}{opponent}_loss_rate" in header
            assert f"{prefix}{opponent}_second_loss_rate" in header
    assert header[-len(EXPLOITABILITY_FIELDS) :] == [f"search_{f}" for f in EXPLOITABILITY_FIELDS]
    agg = Aggregator()
    row = agg.on_eval(
        {
            "mean": 0.5,
            "search_random_first_win_rate": 0.75,
            "search_exploitability": 0.0,
            "search_losing_lines": -3,  # out of range: dropped
            "random_second_loss_rate": 1.5,  # not a share: dropped
        },
        1.0,
    )
    assert row["search_random_first_win_rate"] == 0.75 and row["search_exploitability"] == 0
    assert "search_losing_lines" not in row and "random_second_loss_rate" not in row


def test_a_resumed_run_appends_under_its_eval_csvs_header(tmp_path: Path) -> None:
    cartpole = load_config(REPO / "configs" / "cartpole_ppo.yaml").model_dump(mode="json")
    writer = MetricsWriter(tmp_path, tensorboard=False)  # no config: every column
    writer.write_eval({"time": 1.0, "env_steps": 100, "mean": 10.0})
    writer.close()
    writer = MetricsWriter(tmp_path, tensorboard=False, config=cartpole)
    writer.write_eval({"time": 2.0, "env_steps": 200, "mean": 20.0})
    writer.close()
    assert eval_header(tmp_path) == EVAL_FIELDS
    assert [r["mean"] for r in read_csv(tmp_path / "eval.csv")] == [10.0, 20.0]


def league_info(members: int = 3) -> dict[str, Any]:
    """A league role's heartbeat info (``LeagueRole.heartbeat_info``)."""
    return {
        "games": 1200,
        "snapshots": members,
        "main_win_rate": 0.61,
        "elo_main": 1234.5,
        "elo_top": {"main": 1234.5, "main@40": 1200.0},
        "main_vs": {"random": 0.98, **{f"main@{10 * k}": 0.6 for k in range(members)}},
        "players": {"main": {"win_rate": 0.61, "elo": 1234.5, "snapshots": 2, "resets": 0}},
        "matches_served": 99,
    }


def test_the_league_record_keeps_mains_figures_bounded() -> None:
    record = league_record(league_info())
    assert record == {
        "games": 1200,
        "snapshots": 3,
        "elo_main": 1234.5,
        "main_win_rate": 0.61,
        "main_vs": {"random": 0.98, "main@0": 0.6, "main@10": 0.6, "main@20": 0.6},
        "players": {"main": {"win_rate": 0.61, "elo": 1234.5, "snapshots": 2, "resets": 0}},
        "elo_top": {"main": 1234.5, "main@40": 1200.0},
    }
    assert league_record({"games": 3}) is None and league_record("league") is None
    # Whatever a heartbeat holds, the head keeps at most MAX_LEAGUE_MEMBERS plain names with
    # numbers, and no other keys.
    forged = league_info(members=5000)
    forged["main_vs"].update({"x" * 65: 0.5, "bad name": 0.5, "ok": "0.5", "nested": {"a": 1}})
    forged["players"] = {f"p{k}": {"win_rate": 0.5, "extra": "y" * 1000} for k in range(100)}
    forged["junk"] = "z" * 100_000
    record = league_record(forged)
    assert record is not None and set(record) == {*LEAGUE_COUNTS, "main_vs", "players", "elo_top"}
    assert len(record["main_vs"]) == len(record["players"]) == MAX_LEAGUE_MEMBERS
    assert all(p == {"win_rate": 0.5} for p in record["players"].values())
    assert len(json.dumps(record)) < 8192
    odd = {**league_info(members=0), "main_vs": {"x" * 65: 0.5, "bad name": 0.5, "ok": "0.5"}}
    record = league_record({**odd, "players": [1, 2], "elo_top": {"main": True, "a@1": 9.0}})
    assert record is not None and record["main_vs"] == {} and record["players"] == {}
    assert record["elo_top"] == {"a@1": 9.0}


def test_league_csv_holds_the_league_and_the_latest_evaluation_over_time(tmp_path: Path) -> None:
    record = league_record(league_info(members=1))
    assert record is not None
    evaluation = {"mean": 0.9, "random_win_rate": 0.97, "exploitability": 0.0, "losing_lines": 0}
    writer = MetricsWriter(tmp_path, tensorboard=False)
    assert not (tmp_path / "league.csv").exists()  # a run without a league writes none
    writer.write_league(10.0, 500, league_figures(record, None))
    writer.write_league(20.0, 900, league_figures({**record, "games": 1500}, evaluation))
    writer.close()
    with open(tmp_path / "league.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    at = {(float(r["time"]), r["name"]): float(r["value"]) for r in rows}
    assert at[(10.0, "elo_main")] == 1234.5 and at[(10.0, "main_vs/main@0")] == 0.6
    assert at[(10.0, "main/win_rate")] == 0.61 and at[(10.0, "elo/main@40")] == 1200.0
    assert (10.0, "eval/exploitability") not in at
    assert at[(20.0, "games")] == 1500 and at[(20.0, "eval/random_win_rate")] == 0.97
    assert at[(20.0, "eval/exploitability")] == 0.0
    assert {r["env_steps"] for r in rows} == {"500", "900"}


def test_the_summary_figures_of_the_evaluations() -> None:
    evals = [
        {"weights_version": 1, "mean": 0.5},
        {"weights_version": 2, "mean": 0.7, "exploitability": 1.0, "losing_lines": 90},
        {"weights_version": 3, "mean": 0.8, "exploitability": 0.0, "losing_lines": 0},
        {
            "weights_version": 4,
            "mean": 0.9,
            "exploitability": 0.5,
            "exploitability_first": 0,
            "exploitability_second": -1,
            "losing_lines": 3,
            "random_win_rate": 0.9,
            "random_draw_rate": 0.06,
            "random_loss_rate": 0.04,
            "scripted_draw_rate": 1.0,
        },
    ]
    assert exploitability_summary(evals) == {
        "last": {
            "weights_version": 4,
            "exploitability": 0.5,
            "exploitability_first": 0,
            "exploitability_second": -1,
            "losing_lines": 3,
        },
        "best": 0.0,
        "best_weights_version": 3,
        "evaluations": 3,
    }
    assert exploitability_summary(evals[:1]) is None
    assert reference_rates(evals[-1]) == {
        "random": {"win": 0.9, "draw": 0.06, "loss": 0.04},
        "scripted": {"draw": 1.0},
    }
    assert reference_rates(None) == {} and reference_rates(evals[0]) == {}
