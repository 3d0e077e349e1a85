"""`zrl run` of QMIX on MPE's simple_spread, feed-forward and with a GRU agent network
(``model.core``), every role its own process: it trains and leaves nothing behind."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from zrl.testing.processes import GUARD_S, run_zrl, zrl_eval

RECURRENT = (
    "model.core=gru",
    "model.core_size=32",
    "qmix.sequence_length=10",
    "qmix.burn_in=2",
    "replay.batch_size=32",
)
"""Recurrent QMIX: team sequences of 10 steps through replay, the agents' GRU states."""


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [(), RECURRENT], ids=["feed_forward", "gru"])
def test_qmix_spread_run_trains_and_cleans_up(tmp_path: Path, overrides: tuple[str, ...]) -> None:
    # A small run: 4 games per actor, a replay that starts sampling early, evaluations of 4
    # games; 300 updates end it, the wall time is a guard (learning is measured by the
    # shipped config, docs). Not fewer: a fast machine made 100 within one of the learner's
    # 1-s metrics reports, and train_metrics.csv then had no loss to show.
    summary = run_zrl(
        tmp_path,
        "simple_spread_qmix.yaml",
        "env.num_envs=4",
        "replay.min_size=200",
        "evaluator.episodes=4",
        "evaluator.interval=2",
        "stop.updates=300",
        *overrides,
        wall_time=GUARD_S,
        beats=None,
    )
    run_dir = summary["dir"]
    assert summary["stop_reason"] == "updates", summary
    assert summary["updates"] >= 300 and summary["env_steps"] > 0, summary
    with open(run_dir / "train_metrics.csv", newline="") as f:
        tags = {r["tag"] for r in csv.DictReader(f)}
    assert {"learner/loss", "learner/q_tot_mean", "actor/epsilon"} <= tags, sorted(tags)
    # zrl eval builds the model from the config alone (the agents from a probe game; a GRU
    # agent network steps each agent's state through the episode).
    mean, out = zrl_eval(run_dir, 2)
    assert mean < 0, out
