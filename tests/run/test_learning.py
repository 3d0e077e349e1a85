"""The head's rule "a run that did not learn says so" (``zrl.run.learning``): on rows as the
registry reports them, and in summary.json through an --inproc supervisor."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.run_dir import check_run_dir, stop_supervisor
from zrl.config.experiment import ExperimentConfig
from zrl.run.learning import ProgressWatch, did_not_learn

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


# --- while the run goes: ProgressWatch ----------------------------------------------------


def actor(steps: int) -> dict[str, Any]:
    return {"id": "actor-0", "role": "actor", "state": "alive", "info": {"env_steps": steps}}


WATCHED = ExperimentConfig.model_validate(
    {"name": "x", "learner": {"publish_interval": 10}, "stop": {"no_progress": 60}}
)


def test_a_learner_stuck_while_actors_step_fails_the_run() -> None:
    """Issue 39, item 10: a group stopped by a NaN all-reduce made no update for the rest of
    the run while the actors stepped on, and the run ended ``failed: false``."""
    watch = ProgressWatch(WATCHED)
    assert watch.observe([learner(5, 5, 50), params(5), actor(1000)], now=0.0) is None
    # The actors step on; the learner's updates stay at 50.
    for t in range(1, 60):
        rows = [learner(5, 5, 50), params(5), actor(1000 + 100 * t)]
        assert watch.observe(rows, now=float(t)) is None, t
    reason = watch.observe([learner(5, 5, 50), params(5), actor(7000)], now=60.0)
    assert reason is not None and "learner-0 made no update" in reason


def test_learning_that_goes_on_or_has_not_begun_is_not_judged() -> None:
    watch = ProgressWatch(WATCHED)
    for t in range(0, 300, 5):
        # Before its first update (replay warming up): not judged, however long.
        assert watch.observe([learner(0, 0, 0), params(0), actor(100 * t)], float(t)) is None
    watch = ProgressWatch(WATCHED)
    for t in range(0, 300, 5):  # updates and versions move: fine
        rows = [learner(t, t, 10 * t + 1), params(t + 1), actor(100 * t)]
        assert watch.observe(rows, float(t)) is None
    watch = ProgressWatch(WATCHED)
    for t in range(0, 300, 5):  # nothing moves at all (the actors wait too): not this rule's
        assert watch.observe([learner(5, 5, 50), params(5), actor(1000)], float(t)) is None
    off = ExperimentConfig.model_validate({"name": "x", "stop": {"no_progress": None}})
    watch = ProgressWatch(off)
    for t in range(0, 300, 5):
        assert watch.observe([learner(5, 5, 50), params(5), actor(100 * t)], float(t)) is None


def test_params_stuck_while_the_learner_trains_fails_the_run() -> None:
    watch = ProgressWatch(WATCHED)
    for t in range(0, 60, 5):  # the learner trains and sends; params stays at v7
        rows = [learner(10 + t, 10, 100 + 10 * t), params(7), actor(100 * t)]
        assert watch.observe(rows, float(t)) is None, t
    reason = watch.observe([learner(80, 10, 800), params(7), actor(7000)], now=61.0)
    assert reason is not None and "stayed at v7" in reason
