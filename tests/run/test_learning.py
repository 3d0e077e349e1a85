"""The head's rule "a run that did not learn says so" (``zrl.run.learning``): on rows as the
registry reports them, and in summary.json through an --inproc supervisor."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.run_dir import check_run_dir, stop_supervisor
from zrl.config.experiment import ExperimentConfig
from zrl.run.learning import did_not_learn

CFG = ExperimentConfig.model_validate({"name": "x", "learner": {"publish_interval": 10}})


def learner(sent: int, acked: int, updates: int, **info: Any) -> dict[str, Any]:
    return {
        "id": "learner-0",
        "role": "learner",
        "state": "alive",
        "info": {"weights_sent": sent, "weights_acked": acked, "updates": updates, **info},
    }


def params(version: int, **info: Any) -> dict[str, Any]:
    return {
        "id": "params-0",
        "role": "params",
        "state": "alive",
        "info": {"weights_version": version, **info},
    }


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        # Every update refused (issue 27: a forged first WEIGHTS fixed another layout).
        ([learner(40, 0, 400), params(1)], "acknowledged 0 of the 40"),
        # Only the initial weights taken, nothing after.
        ([learner(5, 1, 50), params(1)], "acknowledged 1 of the 5"),
        # The learner's acks came, but params' version never moved while it trained.
        ([learner(2, 2, 30), params(1)], "stayed at v1"),
        # A named policy's version is its own.
        (
            [
                learner(2, 2, 30, policy="main_exploiter_0"),
                params(9, weights_version_main_exploiter_0=0),
            ],
            "'main_exploiter_0' stayed at v0",
        ),
    ],
)
def test_a_run_whose_weights_never_reached_params_did_not_learn(rows, words) -> None:
    reason = did_not_learn(CFG, rows)
    assert reason is not None and words in reason, reason


@pytest.mark.parametrize(
    "rows",
    [
        [learner(40, 39, 400), params(39)],  # a healthy run
        [learner(2, 0, 0), params(0)],  # just started: params still setting up
        [learner(0, 0, 400), params(50)],  # a DD-PPO follower: it never publishes
        [params(12)],  # A3C: params owns the weights, no learner
        [learner(3, 3, 5), params(3001)],  # resumed: versions continue from the floor
    ],
)
def test_runs_that_learned_or_cannot_tell_yet_pass(rows) -> None:
    assert did_not_learn(CFG, rows) is None


def test_a_run_that_did_not_learn_fails_in_its_summary(tmp_path, monkeypatch) -> None:
    sup = stop_supervisor(tmp_path, monkeypatch, wall_time=0.001)
    real_final_row = sup.monitor.final_row

    def final_row(row: dict[str, Any], elapsed: float) -> dict[str, Any]:
        out = real_final_row(row, elapsed)
        # The last heartbeats of a run whose learner params refused throughout.
        sup.monitor.status_rows = [learner(12, 0, 120), params(0)]
        return out

    monkeypatch.setattr(sup.monitor, "final_row", final_row)
    summary = sup.run()
    assert summary["stop_reason"] == "wall_time" and summary["failed"]
    assert summary["error"].startswith("learner-0 did not learn")
    check_run_dir(sup, summary)
